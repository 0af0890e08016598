"""`undo`: reverse an operator action (a redrive, a purge or an edit), itself recorded as an action.

Two ways, as the ledger allows:

- **restore** (a purge only): when no other commit changed the purge's tables since it finished (each
  still holds the files of the version it left it at), and the files of the versions before it are
  all still there, every table is restored to the version it had before (Delta RESTORE, itself a
  commit, carrying the app transaction `poison_pipeline:restore/<undo id>`);
- **compensate**: otherwise, and always for a redrive or an edit, the messages still where the
  action put them are moved back, taken from the table as it was before the action (Delta time
  travel), and those that cannot come back are named, each with its reason. A redrive's target is
  an inbound, which takes commits that need no lease (an enqueue; for a redrive `--to`, the
  target's own cycles): a restore would roll back any that landed while the redrive ran.

The undo runs under the lease of the action's queue (and of the redrive's target), once their cycles
a kill left staged are finished: such a cycle's commits would otherwise land on messages the undo
moved. It is recorded `planned` with the way it chose, moves or restores, is recorded `done`, and
then the action is marked `undone`. Killed at any point and run again, it checks the way it chose
again: a restore goes on only while every table it has not restored yet is still as the action left
it (its own restores are known by their app transaction); else it compensates for what remains,
never restoring one table and compensating the other's half. It moves nothing twice (an append back
is an app transaction; a row is removed only while it is still there) and answers as the
uninterrupted undo would: what came back and what cannot are worked out from the tables each time,
not remembered from the first run.

- a **redrive**: from the target's inbound back to the failure table it came from; those that left
  the inbound since (processed, or failed again) cannot come back;
- a **purge**: the rows are read from the table as it was before the purge and their rows leave the
  `purged` ledger, so the conservation line still balances. Time travel reads the files of that
  version, which a vacuum deletes: what is still readable comes back, the rest stays purged (still
  in the ledger) and is named with the reason; when nothing at all can come back, the undo refuses
  and changes nothing;
- an **edit**: its redrive (`<edit id>--redrive`, an action of its own) is undone as above, so the
  message comes back where it failed with its original body, and the edit is marked undone too; its
  `edits` row stays, as history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import DeltaTable, Transaction
from pydantic import Field, field_validator

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.names import ActionName, AppTransaction, begun_earlier
from poison_pipeline.domain.routing import INBOUND, PROCESSED
from poison_pipeline.operations import archive as archiving
from poison_pipeline.operations.actions import (
    ABANDONED,
    DONE,
    UNDONE,
    Action,
    Recorded,
    default_actor,
    find_action,
    mark_undone,
    operator_writer,
)
from poison_pipeline.operations.batches import redrive_batches
from poison_pipeline.operations.requests import ActionContext, Request, not_blank
from poison_pipeline.storage.intake import record_intake
from poison_pipeline.storage.tables import ARCHIVED, PURGED, QueueTables, schema_of
from poison_pipeline.storage.writer import QueueWriter, queue_writers

RESTORE, COMPENSATE = "restore", "compensate"


class UndoError(ValueError):
    """An action that cannot be undone; the message says why."""


@dataclass
class UndoResult:
    undo_id: str
    action_id: str
    kind: str
    how: str  # "restore" or "compensate"
    restored: int = 0  # messages back where they were before the action
    unrecoverable: list[str] = field(default_factory=list)  # cannot come back: see unrecoverable_reasons
    already_undone: bool = False
    # Why they cannot come back: reason -> the ids it applies to (e.g. already processed, vacuumed).
    unrecoverable_reasons: dict[str, list[str]] = field(default_factory=dict)


class UndoOptions(Request):
    """What an undo takes besides a queue: the run config of a queue's undo job in Dagster."""

    action_id: str = Field(description="A redrive, edit, purge, archive or restore (see `poison-pipeline "
                           "actions`).")

    @field_validator("action_id")
    @classmethod
    def _action_id(cls, value: str) -> str:
        return not_blank(value) or value


class UndoRequest(UndoOptions):
    """An undo: a redrive, an edit, a purge, an archive or a restore reversed."""

    queue: str | None = Field(default=None, description="Only an action of this queue.")


def undo(declaration: Declaration, request: UndoRequest, context: ActionContext | None = None) -> UndoResult:
    """Undo the action the request names. Raises UndoError, before writing, for one that cannot be."""
    context = context or ActionContext()
    if request.queue is not None:
        if request.queue not in declaration.queues:
            raise UndoError(f"no queue {request.queue!r} is declared; declared: {', '.join(declaration.queues)}")
        if find_action(QueueTables.of(declaration, request.queue), request.action_id) is None:
            elsewhere = find_recorded(declaration, request.action_id)
            where = f"; it is an action of queue {elsewhere.queue!r}" if elsewhere is not None else \
                " (see `poison-pipeline actions`)"
            raise UndoError(f"action_id {request.action_id!r}: no such action in queue {request.queue!r}{where}")
    return undo_action(declaration, request.action_id, context.actor, context.run_id, context.now)


def undo_action(declaration: Declaration, action_id: str, actor: str | None = None, run_id: str = "manual",
                now: datetime | None = None, within: QueueWriter | None = None) -> UndoResult:
    """Undo the action `action_id` (found in any queue's ledger); `within`: the writer of a caller
    that holds the queue's lease already (a completion of interrupted work)."""
    action = find_recorded(declaration, action_id)
    if action is None:
        raise UndoError(f"no action {action_id!r} is recorded (see `poison-pipeline actions`)")
    if action.kind not in _UNDOERS:
        raise UndoError(f"action {action_id!r} is of kind {action.kind!r}, which cannot be undone "
                        f"(undo reverses {', '.join(sorted(_UNDOERS))})")
    if action.state == UNDONE:
        return UndoResult(undo_id_of(QueueTables.of(declaration, action.queue), action_id), action_id, action.kind,
                          "", already_undone=True)
    if action.state == ABANDONED:
        raise UndoError(f"action {action_id!r} was abandoned: killed before it planned anything, it changed "
                        "nothing, so there is nothing to undo")
    if action.state != DONE:
        raise UndoError(f"action {action_id!r} is {action.state}: run it again with its id to complete it "
                        "before undoing it")
    tables = QueueTables.of(declaration, action.queue)
    # A redrive into another queue is undone under both queues' leases, taken in the one order.
    both = [tables, *([QueueTables.of(declaration, action.arguments["to"])] if action.kind == "redrive" else [])]
    with queue_writers(both, "undo", run_id, within=within) as first, \
            operator_writer(declaration, tables, "undo", run_id, resuming=[undo_id_of(tables, action_id)],
                            within=first) as writer:
        return _UNDOERS[action.kind](declaration, writer, action, actor or default_actor(), run_id,
                                     now or datetime.now(UTC))


def undo_id_of(tables: QueueTables, action_id: str) -> str:
    """The id of the undo of `action_id` (of `tables`' queue): `<id>--undo` (domain/names.py), or
    `undo-<id>` when an earlier version recorded the undo under that name (it completes as begun)."""
    name = ActionName.parse(action_id).undo()
    for spelled in name.spellings()[1:]:
        recorded = find_action(tables, spelled)
        if recorded is not None and recorded.kind == "undo" and recorded.arguments.get("action_id") == action_id:
            return spelled
    return str(name)


def _restore_mark(undo_id: str) -> str:
    """The app transaction each restore commit of undo `undo_id` carries."""
    return AppTransaction.restore(undo_id, legacy=begun_earlier(undo_id)).name


def _back_mark(undo_id: str) -> str:
    """The app transaction of undo `undo_id`'s append back to the action's table."""
    return AppTransaction.undo(undo_id, legacy=begun_earlier(undo_id)).name


def _touched(declaration: Declaration, action: Action) -> list[tuple[QueueTables, str, dict[str, int | None]]]:
    touched = []
    for key, versions in action.versions.items():
        queue, table = key.split("/", 1)
        touched.append((QueueTables.of(declaration, queue), table, versions))
    return touched


def _restored_by(tables: QueueTables, table: str, undo_id: str) -> bool:
    return tables.exists(table) and tables.open(table).transaction_version(_restore_mark(undo_id)) is not None


def _as_left(tables: QueueTables, table: str, version: int | None) -> bool:
    """Whether `table` holds exactly the files it held at `version` (commits that changed no file,
    as a lease's fence, do not count)."""
    if version is None or not tables.exists(table):
        return False
    current = tables.open(table)
    if current.version() == version:
        return True
    try:
        then = DeltaTable(tables.uri(table), version=version, storage_options=tables.storage_options)
    except Exception:  # noqa: BLE001 - delta-rs raises several kinds for a version it cannot load
        return False
    return set(then.file_uris()) == set(current.file_uris())


def _way(declaration: Declaration, action: Action, undo_id: str) -> str:
    """Restore when every table the action touched existed before it, each not restored yet by this
    undo is as the action left it, and every version before is still whole (a RESTORE to a version
    whose files a vacuum deleted fails, or with ignore_missing_files makes a broken table); else
    compensate. A table that did not exist before the action has no version to restore to."""
    for tables, table, versions in _touched(declaration, action):
        if versions["before"] is None:
            return COMPENSATE
        if _restored_by(tables, table, undo_id):
            continue
        if not _as_left(tables, table, versions["after"]):
            return COMPENSATE
        try:
            missing = _as_of_files(tables, table, versions["before"])[1]
        except _LogGone:
            return COMPENSATE
        if missing:
            return COMPENSATE
    return RESTORE


def _recorded_way(declaration: Declaration, tables: QueueTables, action: Action) -> str:
    """The way: an interrupted run's compensation goes on as chosen; a restore is checked again (a
    table it has not restored yet may have moved since)."""
    undo_id = undo_id_of(tables, action.action_id)
    recorded = find_action(tables, undo_id)
    if recorded is not None and recorded.arguments["how"] == COMPENSATE:
        return COMPENSATE
    return _way(declaration, action, undo_id)


def _begin(writer: QueueWriter, action: Action, actor: str, run_id: str, now: datetime,
           arguments: dict[str, Any], touched: list[tuple[QueueTables, str]]) -> Recorded:
    """The undo's record: the one an interrupted run made, or a new one, planned."""
    record = Recorded.of(writer, "undo", undo_id_of(writer.tables, action.action_id))
    record.begin(actor, {"action_id": action.action_id, **arguments}, touched, run_id, now)
    return record


def _complete(writer: QueueWriter, record: Recorded, action: Action, result: UndoResult,
              touched: list[tuple[QueueTables, str]]) -> None:
    """Record the undo done and the action undone, each unless an interrupted run did already."""
    tables = writer.tables
    if not record.finished and record.action is not None:
        record.action = Action(**{**record.action.__dict__, "arguments": {**record.action.arguments,
                                                                          "how": result.how}})
        record.finish({"restored": result.restored, "unrecoverable": len(result.unrecoverable)}, touched)
    recorded = find_action(tables, action.action_id)
    if recorded is None or recorded.state != UNDONE:
        mark_undone(writer, action)


def _undo_redrive(declaration: Declaration, writer: QueueWriter, action: Action, actor: str, run_id: str,
                  now: datetime) -> UndoResult:
    """Always by compensation: the target's inbound takes lease-free commits a restore would undo."""
    tables = writer.tables
    source, target = action.arguments["from"], QueueTables.of(declaration, action.arguments["to"])
    touched = [(tables, source), (target, INBOUND)]
    undo_id = undo_id_of(tables, action.action_id)
    record = _begin(writer, action, actor, run_id, now, {"how": COMPENSATE}, touched)
    with operator_writer(declaration, target, "undo", run_id, resuming=[undo_id], within=writer) as target_writer:
        result = _compensate(writer, source, target_writer, action, record.action_id)
        if target.queue != tables.queue:  # the reverse of the redrive's intake rows
            app_id = AppTransaction.undo_intake(tables.queue, undo_id, legacy=begun_earlier(undo_id)).name
            record_intake(writer, f"undo from {target.queue}", record.action_id, result.restored, now, app_id, 1)
            record_intake(target_writer, f"undo to {tables.queue}", record.action_id, -result.restored, now, app_id,
                          1)
    _complete(writer, record, action, result, touched)
    return result


def _restore(writer: QueueWriter, action: Action, undo_id: str) -> UndoResult:
    """Restore every table the purge touched to its version before, each restore carrying this
    undo's mark; one a killed run restored already is left as it is. The failure table comes back
    before the `purged` ledger lets go: a kill between the two leaves a message in two places, which
    the next run settles, never in none."""
    mark = [Transaction(_restore_mark(undo_id), 1)]
    for key, versions in sorted(action.versions.items(), key=lambda item: (item[0].endswith(f"/{PURGED}"), item[0])):
        table = key.split("/", 1)[1]
        if not _restored_by(writer.tables, table, undo_id):
            writer.restore(table, int(versions["before"] or 0), writer.tables.open(table), also=mark)
    return UndoResult(undo_id, action.action_id, action.kind, RESTORE, restored=int(action.counts.get("purged", 0)))


def _pairs(rows: pa.Table) -> set[tuple[str, str | None]]:
    return set(zip(rows["message_id"].to_pylist(), rows["batch_id"].to_pylist(), strict=True))


def _rows_now(tables: QueueTables, table: str, ids: list[str]) -> pa.Table:
    return tables.open(table).to_pyarrow_dataset().to_table(
        columns=["message_id", "batch_id"], filter=pads.field("message_id").isin(pa.array(ids, pa.string())))


def _compensate(writer: QueueWriter, source: str, target_writer: QueueWriter, action: Action,
                undo_id: str) -> UndoResult:
    """Move back what is still in the target's inbound under the redrive's batches; a message whose
    very row (same batch) is back in the source already came back by an interrupted run of this undo."""
    tables, target = writer.tables, target_writer.tables
    # Its batches by their whole name: redrive fix's are not those of a redrive fix-2 (domain/names.py).
    mine = redrive_batches(target, tables.queue, action.action_id)
    inbound = target.open(INBOUND).to_pyarrow_dataset().to_table(columns=["message_id", "batch_id"], filter=mine)
    still = set(inbound["message_id"].to_pylist())
    versions = action.versions[f"{tables.queue}/{source}"]
    original = _as_of(tables, source, versions["before"])
    left = _as_of(tables, source, versions["after"], columns=["message_id"])["message_id"]
    moved_then = original.filter(pc.invert(pc.is_in(original["message_id"], value_set=left)))
    ids = sorted(set(moved_then["message_id"].to_pylist()))
    present = _rows_now(tables, source, ids)
    came_back = {m for m, _ in _pairs(present) & _pairs(moved_then)}
    if _restored_by(target, INBOUND, undo_id):
        # A run of this undo by an earlier version, which restored inbounds, was killed after
        # restoring this one (only as the redrive left it): the redrive's rows all left it.
        still = set(ids)
    back = moved_then.filter(pc.and_(
        pc.is_in(moved_then["message_id"], value_set=pa.array(sorted(still), pa.string())),
        pc.invert(pc.is_in(moved_then["message_id"], value_set=present["message_id"]))))
    if target.queue != tables.queue and still:
        _hold(target_writer, mine, still)
    if back.num_rows:
        writer.append(source, back.cast(schema_of(source)), app_id=_back_mark(undo_id), version=1)
    if inbound.num_rows:
        batches = sorted(set(inbound["batch_id"].to_pylist()))
        target_writer.replace_batches(INBOUND, batches, keep=~pads.field("message_id").isin(sorted(still)))
    restored = still | came_back
    lost = sorted(set(ids) - restored)
    return UndoResult(undo_id, action.action_id, action.kind, COMPENSATE, restored=len(restored),
                      unrecoverable=lost, unrecoverable_reasons=_why_gone(target, lost))


# When a held copy comes due: never (the undo that holds it removes it).
_HELD_UNTIL = datetime(9999, 12, 31, tzinfo=UTC)


def _hold(target_writer: QueueWriter, mine: pc.Expression, still: set[str]) -> None:
    """Make the redriven copies in another queue's inbound wait until this undo removes them, in one
    commit, before the messages go back: a kill between going back and the removal would otherwise
    leave a copy that the target's own cycles deliver (they do not complete another queue's undo),
    and the message would end in two places."""
    ids = pa.array(sorted(still), pa.string())
    rows = target_writer.tables.open(INBOUND).to_pyarrow_dataset().to_table(
        filter=mine & pc.field("message_id").isin(ids))
    if rows.num_rows == 0 or pc.all(pc.equal(rows["due_at"], pa.scalar(_HELD_UNTIL, rows["due_at"].type))).as_py():
        return  # held by an earlier run of this undo
    held = rows.set_column(rows.schema.get_field_index("due_at"), "due_at",
                           pa.array([_HELD_UNTIL] * rows.num_rows, rows["due_at"].type))
    target_writer.replace_batches(INBOUND, sorted(set(rows["batch_id"].to_pylist())),
                                  keep=~pads.field("message_id").isin(ids), add=held)


def _why_gone(target: QueueTables, ids: list[str]) -> dict[str, list[str]]:
    if not ids:
        return {}
    done = set(target.open(PROCESSED).to_pyarrow_dataset().to_table(
        columns=["message_id"], filter=pads.field("message_id").isin(ids))["message_id"].to_pylist())
    reasons = {f"already processed by {target.queue}": sorted(done & set(ids)),
               f"left {target.queue}/inbound since the redrive (failed again, or moved on)": sorted(set(ids) - done)}
    return {why: which for why, which in reasons.items() if which}


class _LogGone(Exception):  # noqa: N818 - a version whose log entries are gone (cleaned up)
    pass


def _as_of_files(tables: QueueTables, table: str, version: int | None) -> tuple[pads.Dataset | None, list[str]]:
    """The table's dataset at `version` (Delta time travel) over the files still there, and the
    paths of its files that are gone (a vacuum deletes those of old versions)."""
    if version is None:
        return None, []
    try:
        old = DeltaTable(tables.uri(table), version=version, storage_options=tables.storage_options)
    except Exception as error:  # delta-rs raises several kinds for a version it cannot load
        raise _LogGone(f"{type(error).__name__}: {error}") from None
    dataset = old.to_pyarrow_dataset()
    fragments: list[pads.Fragment] = []
    missing: list[str] = []
    for fragment in dataset.get_fragments():
        there = dataset.filesystem.get_file_info(fragment.path).type != pafs.FileType.NotFound
        (fragments if there else missing).append(fragment if there else fragment.path)
    if not missing:
        return dataset, []
    return pads.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem), missing


def _as_of(tables: QueueTables, table: str, version: int | None, where: pads.Expression | None = None,
           columns: list[str] | None = None) -> pa.Table:
    """The table as it was at `version`, its rows matching `where`; the action held the queue's
    lease, so what left it between the action's versions is exactly what it took."""
    if version is None:
        empty = schema_of(table).empty_table()
        return empty.select(columns) if columns else empty
    old = DeltaTable(tables.uri(table), version=version, storage_options=tables.storage_options)
    return old.to_pyarrow_dataset().to_table(filter=where, columns=columns)


@dataclass
class _PurgeBack:
    """What an undo of a purge brings back, worked out from the tables before anything is written."""

    back: pa.Table  # rows read from the table before the purge, not in the table now
    found: list[str]  # ids that come back (or came back, by an interrupted run)
    lost: dict[str, list[str]]  # reason -> ids that cannot come back
    restored: int


def _undo_purge(declaration: Declaration, writer: QueueWriter, action: Action, actor: str, run_id: str,
                now: datetime) -> UndoResult:
    tables = writer.tables
    source = action.arguments["table"]
    touched = [(tables, source), (tables, PURGED)]
    how = _recorded_way(declaration, tables, action)
    # Worked out before anything is recorded: when nothing at all can come back, the undo refuses
    # and changes nothing.
    plan = _purge_back(tables, source, action) if how == COMPENSATE else None
    record = _begin(writer, action, actor, run_id, now, {"how": how}, touched)
    if plan is None:
        result = _restore(writer, action, record.action_id)
    else:
        result = _compensate_purge(writer, source, action, record.action_id, plan)
    _complete(writer, record, action, result, touched)
    return result


def _purge_back(tables: QueueTables, source: str, action: Action) -> _PurgeBack:
    """The purge's rows still in the `purged` ledger; of those, the ones whose very row (same batch)
    is back in the table already, and the others read from the table as it was before the purge
    (time travel), as far as its files are still there. Raises UndoError, naming every message and
    why, when none at all can come back."""
    # A killed run of this undo that restored the ledger took the purge's rows out of it: they are
    # read as the purge left it.
    version = action.versions[f"{tables.queue}/{PURGED}"]["after"] if _restored_by(
        tables, PURGED, undo_id_of(tables, action.action_id)) else None
    ledger = _as_of(tables, PURGED, version, pads.field("action_id") == action.action_id,
                    ["message_id", "batch_id"]) if version is not None else tables.open(PURGED).to_pyarrow_dataset(
    ).to_table(columns=["message_id", "batch_id"], filter=pads.field("action_id") == action.action_id)
    ids = sorted(set(ledger["message_id"].to_pylist()))
    wanted = _pairs(ledger)
    present = _rows_now(tables, source, ids)
    came_back = {m for m, _ in _pairs(present) & wanted}
    before = action.versions[f"{tables.queue}/{source}"]["before"]
    back = schema_of(source).empty_table()
    lost: dict[str, list[str]] = {}
    pending = sorted(set(ids) - came_back)
    if pending:
        try:
            dataset, missing = _as_of_files(tables, source, before)
        except _LogGone as error:
            dataset, missing = None, []
            lost[f"{tables.queue}/{source} version {before} can no longer be read: its Delta log is gone "
                 f"({error})"] = pending
        if dataset is not None:
            read = dataset.to_table(filter=pads.field("message_id").isin(pa.array(pending, pa.string())))
            read = read.filter(pa.array([p in wanted for p in zip(read["message_id"].to_pylist(),
                                                                   read["batch_id"].to_pylist(), strict=True)],
                                        pa.bool_()))
            back = read.filter(pc.invert(pc.is_in(read["message_id"], value_set=present["message_id"])))
            gone = sorted(set(pending) - set(read["message_id"].to_pylist()))
            if gone:
                why = (f"their rows were in {len(missing)} file(s) of {tables.queue}/{source} version {before} "
                       "that a vacuum deleted (time travel reads only files still there)") if missing else \
                    f"not in {tables.queue}/{source} as of version {before}"
                lost[why] = gone
    unrecoverable = sorted({m for which in lost.values() for m in which})
    restored = int(action.counts.get("purged", len(ids))) - len(unrecoverable)
    if restored <= 0:
        reasons = "; ".join(f"{why}: {', '.join(which)}" for why, which in lost.items())
        raise UndoError(f"purge {action.action_id!r} cannot be undone: none of its {len(unrecoverable)} "
                        f"message(s) can come back ({reasons}). Nothing was changed.")
    found = sorted(came_back | set(back["message_id"].to_pylist()))
    return _PurgeBack(back, found, lost, restored)


def _compensate_purge(writer: QueueWriter, source: str, action: Action, undo_id: str,
                      plan: _PurgeBack) -> UndoResult:
    """Append back the rows read, then take what came back out of the `purged` ledger; what cannot
    come back stays purged (in the ledger), so the conservation line still balances."""
    tables = writer.tables
    if plan.back.num_rows:
        writer.append(source, plan.back.cast(schema_of(source)), app_id=_back_mark(undo_id), version=1)
    if plan.found:
        gone = (pads.field("action_id") == action.action_id) & pads.field("message_id").isin(
            pa.array(plan.found, pa.string()))
        still = tables.open(PURGED).to_pyarrow_dataset().to_table(columns=["batch_id"], filter=gone)
        if still.num_rows:  # a run again after they left the ledger commits nothing
            writer.replace_batches(PURGED, set(still["batch_id"].to_pylist()), keep=~gone)
    unrecoverable = sorted({m for which in plan.lost.values() for m in which})
    return UndoResult(undo_id, action.action_id, action.kind, COMPENSATE, restored=plan.restored,
                      unrecoverable=unrecoverable, unrecoverable_reasons=plan.lost)


def _undo_edit(declaration: Declaration, writer: QueueWriter, action: Action, actor: str, run_id: str,
               now: datetime) -> UndoResult:
    """Undo the edit's redrive (an action of its own: the message comes back where it failed, with the
    original body its row had there before), then mark the edit undone; its `edits` row stays."""
    tables = writer.tables
    source, redrive_id = action.arguments["from"], action.arguments["redrive_id"]
    touched = [(tables, source), (tables, INBOUND)]
    linked = find_action(tables, redrive_id)
    if linked is None or linked.state not in (DONE, UNDONE):
        raise UndoError(f"edit {action.action_id!r}: its redrive {redrive_id!r} is "
                        f"{'not recorded' if linked is None else linked.state}: run the edit again to complete it")
    record = _begin(writer, action, actor, run_id, now, {"redrive_id": redrive_id}, touched)
    # Undone already (by `undo` of the redrive itself, or by this undo before it was killed), the
    # redrive's undo changes nothing more and answers what it did.
    inner = _undo_redrive(declaration, writer, linked, actor, run_id, now)
    result = UndoResult(record.action_id, action.action_id, action.kind, inner.how, restored=inner.restored,
                        unrecoverable=inner.unrecoverable, unrecoverable_reasons=inner.unrecoverable_reasons)
    _complete(writer, record, action, result, touched)
    return result


def _undo_archive(declaration: Declaration, writer: QueueWriter, action: Action, actor: str, run_id: str,
                  now: datetime) -> UndoResult:
    """An archive's markers removed, or a restore's put back: the messages never moved."""
    touched = [(writer.tables, ARCHIVED)]
    record = _begin(writer, action, actor, run_id, now, {"how": COMPENSATE}, touched)
    result = UndoResult(record.action_id, action.action_id, action.kind, COMPENSATE,
                        restored=archiving.reverse(writer, action, record.action_id))
    _complete(writer, record, action, result, touched)
    return result


_UNDOERS = {"redrive": _undo_redrive, "purge": _undo_purge, "edit": _undo_edit, "archive": _undo_archive,
            "restore": _undo_archive}
# The kinds of action an undo reverses, reading the versions each recorded (maintenance keeps them).
UNDOABLE: tuple[str, ...] = tuple(_UNDOERS)


def find_recorded(declaration: Declaration, action_id: str) -> Action | None:
    """The action `action_id` in whichever queue's ledger has it."""
    for queue in declaration.queues:
        found = find_action(QueueTables.of(declaration, queue), action_id)
        if found is not None:
            return found
    return None


def complete_interrupted_undo(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> None:
    """An undo a kill left planned, completed by its queue's next holder. One across queues takes the
    other queue's lease too (this writer stays held): left half done, it would leave a message in
    both queues."""
    undo_action(declaration, action.arguments["action_id"], actor=action.actor, run_id=run_id, within=writer)
