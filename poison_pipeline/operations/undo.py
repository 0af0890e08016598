"""`undo`: reverse an operator action (a redrive, a purge or an edit), itself recorded as an action.

Two ways, as the ledger allows:

- **restore**: when no other commit touched the action's tables since it finished (each is still
  at the version it left it at), every table is restored to the version it had before (Delta
  RESTORE, itself a commit);
- **compensate**: otherwise, the messages still where the action put them are moved back, taken
  from the source table as it was before the action (Delta time travel), and those that moved on
  since (processed, failed again...) are named as no longer recoverable.

Both are safe to run again: a message is appended back only if it is not there already, under an
app transaction, and removed from where the action put it only if it is still there.

- a **redrive**: from the target's inbound back to the failure table it came from;
- a **purge**: the rows are taken from the table as it was before the purge (time travel, possible
  until a vacuum deletes those files: then the undo refuses, naming them) and their rows leave the
  `purged` ledger, so the conservation line still balances;
- an **edit**: its redrive (`<edit id>-redrive`, an action of its own) is undone as above, so the
  message comes back where it failed with its original body, and the edit is marked undone too; its
  `edits` row stays, as history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.operations.actions import (
    DONE,
    UNDONE,
    Action,
    begin_action,
    default_actor,
    find_action,
    finish_action,
    mark_undone,
    table_version,
)
from poison_pipeline.storage.intake import record_intake
from poison_pipeline.storage.tables import PURGED, QueueTables, schema_of


class UndoError(ValueError):
    """An action that cannot be undone; the message says why."""


@dataclass
class UndoResult:
    undo_id: str
    action_id: str
    kind: str
    how: str  # "restore" or "compensate"
    restored: int = 0  # messages back where they were before the action
    unrecoverable: list[str] = field(default_factory=list)  # moved on since: processed, failed again...
    already_undone: bool = False


def undo(declaration: Declaration, action_id: str, actor: str | None = None, run_id: str = "manual",
         now: datetime | None = None) -> UndoResult:
    """Undo the action `action_id` (found in any queue's ledger)."""
    action = find_recorded(declaration, action_id)
    if action is None:
        raise UndoError(f"no action {action_id!r} is recorded (see `poison-pipeline actions`)")
    if action.kind not in _UNDOERS:
        raise UndoError(f"action {action_id!r} is a {action.kind}, which cannot be undone "
                        f"(undo reverses {', '.join(sorted(_UNDOERS))})")
    if action.state == UNDONE:
        return UndoResult(f"undo-{action_id}", action_id, action.kind, "", already_undone=True)
    if action.state != DONE:
        raise UndoError(f"action {action_id!r} is {action.state}: run it again with its id to complete it "
                        "before undoing it")
    tables = QueueTables.of(declaration, action.queue)
    with tables.lease("undo", run_id):
        return _UNDOERS[action.kind](declaration, tables, action, actor or default_actor(), run_id,
                                     now or datetime.now(UTC))


def _untouched_since(declaration: Declaration, action: Action) -> bool:
    for key, versions in action.versions.items():
        queue, table = key.split("/", 1)
        if table_version(QueueTables.of(declaration, queue), table) != versions["after"]:
            return False
    return True


def _undo_redrive(declaration: Declaration, tables: QueueTables, action: Action, actor: str, run_id: str,
                  now: datetime) -> UndoResult:
    source, target = action.arguments["from"], QueueTables.of(declaration, action.arguments["to"])
    undo_id = f"undo-{action.action_id}"
    touched = [(tables, source), (target, INBOUND)]
    restore = _untouched_since(declaration, action)
    record = begin_action(tables, "undo", actor, {"action_id": action.action_id, "how": "restore" if restore
                                                  else "compensate"}, touched, action_id=undo_id, run_id=run_id,
                          now=now)
    how = record.arguments["how"]  # as first decided, when an interrupted undo runs again
    with target.lease("undo", run_id):
        if how == "restore":
            result = _restore(declaration, action, undo_id)
        else:
            result = _compensate(tables, source, target, action, undo_id)
        if target.queue != tables.queue:  # the reverse of the redrive's intake rows
            app_id = f"poison_pipeline/{undo_id}"
            record_intake(tables, f"undo from {target.queue}", undo_id, result.restored, now, app_id, 1)
            record_intake(target, f"undo to {tables.queue}", undo_id, -result.restored, now, app_id, 1)
    finish_action(tables, record, {"restored": result.restored, "unrecoverable": len(result.unrecoverable)},
                  touched)
    mark_undone(tables, action)
    return result


def _restore(declaration: Declaration, action: Action, undo_id: str, counted: str = "moved") -> UndoResult:
    for key, versions in action.versions.items():
        queue, table = key.split("/", 1)
        tables = QueueTables.of(declaration, queue)
        current = tables.open(table)
        # Run again after a crash: a table restored already is at a later version with the old content.
        if versions["before"] is not None and current.version() == versions["after"]:
            current.restore(versions["before"])
    restored = int(action.counts.get(counted, 0))
    return UndoResult(undo_id, action.action_id, action.kind, "restore", restored=restored)


def _compensate(tables: QueueTables, source: str, target: QueueTables, action: Action,
                undo_id: str) -> UndoResult:
    prefix = f"{action.action_id}-"
    inbound = target.open(INBOUND).to_pyarrow_dataset().to_table(
        columns=["message_id", "batch_id"], filter=pc.starts_with(pc.field("batch_id"), prefix))
    still = set(inbound["message_id"].to_pylist())
    versions = action.versions[f"{tables.queue}/{source}"]
    original = _as_of(tables, source, versions["before"])
    moved_then = original.filter(pc.invert(pc.is_in(
        original["message_id"], value_set=_as_of(tables, source, versions["after"])["message_id"])))
    unrecoverable = sorted(set(moved_then["message_id"].to_pylist()) - still)
    back = moved_then.filter(pc.is_in(moved_then["message_id"], value_set=pa.array(sorted(still), pa.string())))
    present = tables.open(source).to_pyarrow_dataset().to_table(
        columns=["message_id"], filter=pads.field("message_id").isin(pa.array(sorted(still), pa.string())))
    back = back.filter(pc.invert(pc.is_in(back["message_id"], value_set=present["message_id"])))
    if back.num_rows:
        tables.append(source, back.cast(schema_of(source)), app_id=f"poison_pipeline/{undo_id}", version=1)
    if inbound.num_rows:
        batches = sorted(set(inbound["batch_id"].to_pylist()))
        target.replace_batches(INBOUND, batches, keep=~pads.field("message_id").isin(sorted(still)))
    return UndoResult(undo_id, action.action_id, action.kind, "compensate", restored=len(still),
                      unrecoverable=unrecoverable)


def _as_of(tables: QueueTables, table: str, version: int | None,
           where: pads.Expression | None = None) -> pa.Table:
    """The table as it was at `version` (Delta time travel), its rows matching `where`; the action
    held the queue's lease, so what left it between the action's versions is exactly what it took."""
    if version is None:
        return schema_of(table).empty_table()
    old = DeltaTable(tables.uri(table), version=version, storage_options=tables.storage_options)
    return old.to_pyarrow_dataset().to_table(filter=where)


def _undo_purge(declaration: Declaration, tables: QueueTables, action: Action, actor: str, run_id: str,
                now: datetime) -> UndoResult:
    source = action.arguments["table"]
    undo_id = f"undo-{action.action_id}"
    touched = [(tables, source), (tables, PURGED)]
    recorded = find_action(tables, undo_id)  # an interrupted undo runs again as first decided
    how = recorded.arguments["how"] if recorded else "restore" if _untouched_since(declaration, action) \
        else "compensate"
    # Read before anything is recorded: when the files are gone, the undo refuses and changes nothing.
    taken = _purged_rows(tables, source, action) if how == "compensate" else None
    record = recorded or begin_action(tables, "undo", actor, {"action_id": action.action_id, "how": how}, touched,
                                      action_id=undo_id, run_id=run_id, now=now)
    if taken is None:
        result = _restore(declaration, action, undo_id, counted="purged")
    else:
        result = _compensate_purge(tables, source, action, undo_id, *taken)
    finish_action(tables, record, {"restored": result.restored, "unrecoverable": len(result.unrecoverable)},
                  touched)
    mark_undone(tables, action)
    return result


def _purged_rows(tables: QueueTables, source: str, action: Action) -> tuple[pa.Table, pa.Table]:
    """The purge's rows still in the `purged` ledger, and their rows in the table as it was before the
    purge (Delta time travel). Raises UndoError, naming the messages, when those files are gone."""
    ledger = tables.open(PURGED).to_pyarrow_dataset().to_table(
        columns=["message_id", "batch_id"], filter=pads.field("action_id") == action.action_id)
    ids = sorted(set(ledger["message_id"].to_pylist()))
    before = action.versions[f"{tables.queue}/{source}"]["before"]
    if not ids:  # run again after the ledger rows left: everything came back already
        return ledger, schema_of(source).empty_table()
    try:
        original = _as_of(tables, source, before, pads.field("message_id").isin(ids))
    except Exception as error:  # the version's files (or its log) are gone: vacuumed, or cleaned up
        named = ", ".join(ids[:20]) + (" ..." if len(ids) > 20 else "")
        raise UndoError(
            f"purge {action.action_id!r} cannot be undone: {tables.queue}/{source} as it was before it "
            f"(Delta version {before}) can no longer be read, its files are gone (a vacuum deletes the files "
            f"of old versions: time travel works only within the retention). {len(ids)} message(s) purged "
            f"for good cannot come back: {named}. Nothing was changed. ({type(error).__name__}: {error})"
        ) from None
    return ledger, original


def _compensate_purge(tables: QueueTables, source: str, action: Action, undo_id: str, ledger: pa.Table,
                      original: pa.Table) -> UndoResult:
    """Append back the purged rows not there already, then take the purge's rows out of the `purged`
    ledger. Each step is safe to repeat: the append is an app transaction, and a ledger row is
    removed only while it is still there."""
    ids = sorted(set(ledger["message_id"].to_pylist()))
    # The purge recorded each message's batch: take that copy, should the table have held two.
    wanted = set(zip(ledger["message_id"].to_pylist(), ledger["batch_id"].to_pylist(), strict=True))
    original = original.filter(pa.array(
        [(m, b) in wanted for m, b in zip(original["message_id"].to_pylist(), original["batch_id"].to_pylist(),
                                          strict=True)], pa.bool_()))
    found = sorted(set(original["message_id"].to_pylist()))
    present = tables.open(source).to_pyarrow_dataset().to_table(
        columns=["message_id"], filter=pads.field("message_id").isin(pa.array(found, pa.string())))
    back = original.filter(pc.invert(pc.is_in(original["message_id"], value_set=present["message_id"])))
    if back.num_rows:
        tables.append(source, back.cast(schema_of(source)), app_id=f"poison_pipeline/{undo_id}", version=1)
    if found:  # their ledger rows leave with them; any that cannot come back stay purged
        batches = set(ledger["batch_id"].to_pylist())
        tables.replace_batches(PURGED, batches, keep=~((pads.field("action_id") == action.action_id)
                                                       & pads.field("message_id").isin(pa.array(found, pa.string()))))
    return UndoResult(undo_id, action.action_id, action.kind, "compensate", restored=len(found),
                      unrecoverable=sorted(set(ids) - set(found)))


def _undo_edit(declaration: Declaration, tables: QueueTables, action: Action, actor: str, run_id: str,
               now: datetime) -> UndoResult:
    """Undo the edit's redrive (an action of its own: the message comes back where it failed, with the
    original body its row had there before), then mark the edit undone; its `edits` row stays."""
    source, redrive_id = action.arguments["from"], action.arguments["redrive_id"]
    undo_id = f"undo-{action.action_id}"
    touched = [(tables, source), (tables, INBOUND)]
    linked = find_action(tables, redrive_id)
    if linked is None or linked.state not in (DONE, UNDONE):
        raise UndoError(f"edit {action.action_id!r}: its redrive {redrive_id!r} is "
                        f"{'not recorded' if linked is None else linked.state}: run the edit again to complete it")
    record = begin_action(tables, "undo", actor, {"action_id": action.action_id, "redrive_id": redrive_id},
                          touched, action_id=undo_id, run_id=run_id, now=now)
    if linked.state == DONE:
        inner = _undo_redrive(declaration, tables, linked, actor, run_id, now)
    else:  # undone already: by `undo` of the redrive itself, or by this undo before it was interrupted
        recorded = find_action(tables, f"undo-{redrive_id}")
        inner = UndoResult(f"undo-{redrive_id}", redrive_id, "redrive",
                           recorded.arguments.get("how", "") if recorded else "",
                           restored=int(recorded.counts.get("restored", 0)) if recorded else 0)
        inner.unrecoverable = [action.arguments["message_id"]] if recorded and \
            recorded.counts.get("unrecoverable") else []
    result = UndoResult(undo_id, action.action_id, action.kind, inner.how, restored=inner.restored,
                        unrecoverable=inner.unrecoverable)
    finish_action(tables, Action(**{**record.__dict__, "arguments": {**record.arguments, "how": inner.how}}),
                  {"restored": result.restored, "unrecoverable": len(result.unrecoverable)}, touched)
    mark_undone(tables, action)
    return result


_UNDOERS = {"redrive": _undo_redrive, "purge": _undo_purge, "edit": _undo_edit}


def find_recorded(declaration: Declaration, action_id: str) -> Action | None:
    """The action `action_id` in whichever queue's ledger has it."""
    for queue in declaration.queues:
        found = find_action(QueueTables.of(declaration, queue), action_id)
        if found is not None:
            return found
    return None
