"""`archive` and `restore`: a reversible "known, ignore it" state for failed messages, apart from purge.

An archived message stays in its failure table, readable (`inspect`, `history`); a marker in the
queue's `archived` table (operations/archived.py) leaves it out of failure groups, checks, alerts
and the selections of `redrive`, `purge` and `edit`, and the conservation line counts it as a term
of its own. `restore` removes the markers: the messages are failures like any other again. An
archive and a restore are actions: recorded with their id, their plan (the markers) committed before
the change, completed by the queue's next holder when a kill interrupts them, undone by `undo` (an
archive's markers removed, a restore's put back). A declared `retention: {archived: AGE}` purges what
was archived longer ago than AGE.

Each is one commit on the `archived` table: an append that carries the app transaction
(`poison_pipeline:action/<id>`, 1), or a rewrite that removes the plan's markers (a replay finds none left).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from pydantic import Field

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.names import AppTransaction, begun_earlier
from poison_pipeline.domain.paths import action_id_part
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.actions import (
    Action,
    Recorded,
    committed,
    find_action,
    new_action_id,
    operator_writer,
    reused_id,
    table_version,
)
from poison_pipeline.operations.archived import markers, row_keys
from poison_pipeline.operations.purge import RETENTION_ACTOR, PurgeResult, ledger_rows, purge_table
from poison_pipeline.operations.requests import ActionContext, ActionId, FailureTable
from poison_pipeline.operations.selection import (
    Filters,
    Selection,
    SelectionError,
    check_table,
    selected,
    selection_filter,
)
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import ARCHIVED, QueueTables
from poison_pipeline.storage.writer import QueueWriter

__all__ = ["ARCHIVE", "RESTORE", "ArchiveError", "ArchiveOptions", "ArchiveRequest", "ArchiveResult",
           "RestoreOptions", "RestoreRequest", "apply_retention", "archive", "restore"]

ARCHIVE, RESTORE = "archive", "restore"
SAMPLE = 5


class ArchiveError(ValueError):
    """An archive or restore that cannot run as asked; the message names the argument."""


class _Marking(Filters):
    """What an archive or a restore takes besides its queue: the run config of its Dagster job."""

    table: FailureTable = Field(description="Where the messages are: poison, dead_letter or quarantine.")
    dry_run: bool = Field(default=False, description="Say what it would change; change nothing.")
    id: ActionId = Field(default=None, description="The action's id; default: a new one. Run again with it, an "
                         "interrupted action completes.")


class ArchiveOptions(_Marking):
    """What an archive takes besides its queue: the run config of a queue's archive job in Dagster."""


class ArchiveRequest(ArchiveOptions):
    """Archiving failed messages: known, left out of groups, checks and alerts, kept readable."""

    queue: str = Field(description="The queue whose failed messages are archived.")


class RestoreOptions(_Marking):
    """What a restore takes besides its queue: the run config of a queue's restore job in Dagster."""


class RestoreRequest(RestoreOptions):
    """Restoring archived messages: failures like any other again."""

    queue: str = Field(description="The queue whose archived messages are restored.")


@dataclass
class ArchiveResult:
    kind: str  # archive or restore
    action_id: str | None  # None: a dry run, or nothing selected
    queue: str
    table: str
    dry_run: bool
    count: int = 0  # archived (or restored); would be, for a dry run
    already_done: bool = False  # this id completed before: nothing changed now
    by_group: dict[str, int] = field(default_factory=dict)
    by_message_type: dict[str, int] = field(default_factory=dict)
    sample_ids: list[str] = field(default_factory=list)
    # The version of the table the selection read (with as_of_version: that version).
    source_version: int | None = None


def archive(declaration: Declaration, request: ArchiveRequest, context: ActionContext | None = None) -> ArchiveResult:
    """Archive the messages of the request's table that match its filters (ArchiveError or
    SelectionError, before anything is written, for a request that cannot run)."""
    return _act(declaration, ARCHIVE, request.queue, request.table, request.selection(), request.dry_run,
                request.id, context or ActionContext())


def restore(declaration: Declaration, request: RestoreRequest, context: ActionContext | None = None) -> ArchiveResult:
    """Restore the archived messages of the request's table that match its filters."""
    return _act(declaration, RESTORE, request.queue, request.table, request.selection(), request.dry_run,
                request.id, context or ActionContext())


def _act(declaration: Declaration, kind: str, queue: str, table: str, selection: Selection, dry_run: bool,
         action_id: str | None, context: ActionContext) -> ArchiveResult:
    if queue not in declaration.queues:
        raise ArchiveError(f"no queue {queue!r} is declared; declared: {', '.join(declaration.queues)}")
    try:
        check_table(table)
    except SelectionError as error:
        raise ArchiveError(f"--table {error}") from None
    if (given := action_id_part(action_id, ArchiveError)) is not None and \
            (why := reused_id(declaration, given, queue, kind)) is not None:
        raise ArchiveError(why)
    selection_filter(selection, table)  # a bad filter fails here, before the lease or any table
    # An archive takes what is not archived yet; a restore, what is.
    wanted = Selection(**{**selection.__dict__, "archived": True if kind == RESTORE else None})
    tables = QueueTables.of(declaration, queue)
    now = context.now or datetime.now(UTC)
    arguments = {"queue": queue, "table": table, "selection": selection.arguments()}
    if dry_run:
        return _summary(kind, None, queue, table, True, _plan_rows(declaration, tables, kind, table, wanted,
                                                                   "dry-run", now))
    tables.ensure()
    with operator_writer(declaration, tables, kind, context.run_id, resuming=[action_id] if action_id else []) \
            as writer:
        if action_id is not None and (record := Recorded.of(writer, kind, action_id)).action is not None:
            return _resume(declaration, record, context.run_id)
        action_id = action_id or new_action_id(kind)
        record = Recorded(writer, kind, action_id)
        version = table_version(tables, table)
        planned = _plan_rows(declaration, tables, kind, table, wanted, action_id, now)
        result = _summary(kind, None, queue, table, False, planned, version)
        if planned.num_rows == 0:
            return result  # nothing to do: nothing recorded
        record.begin(context.actor, {**arguments, "id": action_id}, [(tables, ARCHIVED)], context.run_id, now)
        record.record_plan(planned, {table: version})
        _commit(record, planned)
        result.action_id = action_id
        return result


def _plan_rows(declaration: Declaration, tables: QueueTables, kind: str, table: str, selection: Selection,
               action_id: str, now: datetime) -> pa.Table:
    """The markers an archive adds, or those a restore removes."""
    rows = selected(declaration, tables.queue, table, selection)
    if kind == ARCHIVE:
        return ledger_rows(rows, table, action_id, now, schemas.ARCHIVED, "archived_at")
    marked = markers(tables, table)
    return marked.filter(pc.is_in(row_keys(marked), value_set=row_keys(rows))).cast(schemas.ARCHIVED)


def _commit(record: Recorded, planned: pa.Table) -> None:
    """The plan's one commit (safe to repeat), then the action recorded done."""
    writer, action = record.writer, record.action
    assert action is not None  # begun before its plan
    if record.kind == ARCHIVE:
        app = AppTransaction.action(action.action_id)
        if (archived := writer.tables.open_if_exists(ARCHIVED)) is None or not committed(archived, app):
            writer.append(ARCHIVED, planned, app_id=app.name, version=1)
    else:
        remove_markers(writer, planned)
    record.finish({"selected": planned.num_rows, record.kind + "d": planned.num_rows}, [(writer.tables, ARCHIVED)])


def remove_markers(writer: QueueWriter, planned: pa.Table) -> None:
    """Remove the markers `planned` names from the `archived` table (those left: a replay removes none)."""
    if planned.num_rows == 0:
        return
    named = (pads.field("message_id").isin(planned["message_id"].to_pylist())
             & pads.field("from_table").isin(sorted(set(planned["from_table"].to_pylist()))))
    writer.replace_batches(ARCHIVED, set(planned["batch_id"].to_pylist()), keep=~named)


def complete_interrupted_archive(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> None:
    """An archive or a restore a kill left planned, completed by its queue's next holder."""
    record = Recorded(writer, action.kind, action.action_id, action)
    plan = record.plan()
    if plan is None:  # killed before its plan: it changed nothing; planned now as recorded
        args = action.arguments
        selection = Selection.of_arguments(args["selection"])
        wanted = Selection(**{**selection.__dict__, "archived": True if action.kind == RESTORE else None})
        planned = _plan_rows(declaration, writer.tables, action.kind, args["table"], wanted, action.action_id,
                             action.at)
        record.record_plan(planned, {args["table"]: table_version(writer.tables, args["table"])})
    else:
        planned = plan.rows.cast(schemas.ARCHIVED)
    _commit(record, planned)


def _resume(declaration: Declaration, record: Recorded, run_id: str) -> ArchiveResult:
    action = record.action
    assert action is not None  # recorded: that is what is resumed
    already = record.finished
    if already:
        record.clear()  # killed after it was recorded done
    else:
        complete_interrupted_archive(declaration, record.writer, action, run_id)
    done = find_action(record.writer.tables, action.action_id)
    counts = done.counts if done is not None else {}
    return ArchiveResult(action.kind, action.action_id, action.arguments["queue"], action.arguments["table"],
                         False, count=int(counts.get(action.kind + "d", 0)), already_done=already)


def _summary(kind: str, action_id: str | None, queue: str, table: str, dry_run: bool, planned: pa.Table,
             version: int | None = None) -> ArchiveResult:
    return ArchiveResult(
        kind, action_id, queue, table, dry_run, count=planned.num_rows,
        by_group=dict(Counter(planned["failure_group"].to_pylist()).most_common()),
        by_message_type=dict(Counter(planned["message_type"].to_pylist()).most_common()),
        sample_ids=planned["message_id"].to_pylist()[:SAMPLE], source_version=version)


def apply_retention(declaration: Declaration, queue: str, now: datetime | None = None,
                    run_id: str = "retention") -> list[PurgeResult]:
    """Apply `queue`'s declared `retention`, by the same code as `purge`, recorded with actor
    poison_pipeline: each failure table's messages failed longer ago than its age (archived ones
    are left: they have their own), and the messages archived longer ago than `archived`'s."""
    now = now or datetime.now(UTC)
    results = []
    for table, age in declaration.queue(queue).retention.items():
        if table == ARCHIVED:
            results += _purge_archived(declaration, queue, age, now, run_id)
        else:
            results.append(purge_table(declaration, queue, table, age, actor=RETENTION_ACTOR, run_id=run_id, now=now))
    return results


def _purge_archived(declaration: Declaration, queue: str, age: timedelta, now: datetime,
                    run_id: str) -> list[PurgeResult]:
    tables = QueueTables.of(declaration, queue)
    results = []
    for table in FAILURE_TABLES:
        marked = markers(tables, table)
        old = marked.filter(pc.less(marked["archived_at"], pa.scalar(now - age, schemas.TS))) \
            if marked.num_rows else marked
        if old.num_rows:
            selection = Selection(ids=tuple(sorted(set(old["message_id"].to_pylist()))), archived=True)
            results.append(purge_table(declaration, queue, table, 0, selection, actor=RETENTION_ACTOR,
                                       run_id=run_id, now=now))
    return results


def reverse(writer: QueueWriter, action: Action, undo_id: str) -> int:
    """Reverse a finished archive (its markers removed) or restore (the markers it removed put back,
    as the `archived` table held them before it); safe to repeat. Returns how many messages it
    concerns."""
    tables = writer.tables
    if action.kind == ARCHIVE:
        mine = pads.field("action_id") == action.action_id
        left = tables.open(ARCHIVED).to_pyarrow_dataset().to_table(columns=["batch_id"], filter=mine)
        if left.num_rows:
            writer.replace_batches(ARCHIVED, set(left["batch_id"].to_pylist()), keep=~mine)
        return int(action.counts.get("archived", 0))
    versions = action.versions[f"{tables.queue}/{ARCHIVED}"]
    before, after = (_markers_at(tables, versions[k]) for k in ("before", "after"))
    removed = before.filter(pc.invert(pc.is_in(row_keys(before), value_set=row_keys(after))))
    app = AppTransaction.undo(undo_id, legacy=begun_earlier(undo_id))
    writer.append(ARCHIVED, removed.cast(schemas.ARCHIVED), app_id=app.name, version=1)
    return int(removed.num_rows)


def _markers_at(tables: QueueTables, version: int | None) -> pa.Table:
    if version is None:
        return schemas.ARCHIVED.empty_table()
    then = tables.open(ARCHIVED)
    then.load_as_version(version)
    return then.to_pyarrow_table()
