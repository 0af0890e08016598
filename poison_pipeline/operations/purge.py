"""`purge`: delete for good the failed messages of poison, dead_letter or quarantine that are beyond
saving, older than an age (by failure time) and selected by the same filters as `redrive`; the
declared `retention` purges through the same code (operations/archive.apply_retention, which the
daily schedule calls).

Bodies are deleted: that is the point. Each purged message leaves a row in the queue's `purged`
ledger (message id, conversation, type, the table and batch it was in, when it failed, its failure
group, when it was purged and by which action), so the conservation line counts it as a terminal
outcome of its own, and the actions ledger records the Delta versions before and after, within
whose time travel an undo could still bring the rows back.

A purge has an id (given, or new at every invocation; an id another queue's ledger records is
refused). It runs under the queue's lease, once the queue's cycles a kill left staged are finished:

1. recorded `planned` in the actions ledger;
2. its plan (the ledger rows of what it deletes, and the version of the table it read them from)
   committed to the queue's `plans` table (storage/plans.py);
3. the ledger rows appended to `purged` under the app transaction (purge id, 1): a replay writes
   nothing;
4. the rows removed from the table, in a commit that carries the app transaction (purge id, removed);
5. recorded `done` with its counts; the plan is removed.

A purge killed at any point is completed by the next purge of the queue (whatever it asks), by a
cycle of the queue, or by running it again with its id; nothing is deleted twice or counted twice.
A completion deletes only the messages still where the plan found them (the table, the same batch):
one that left since (redriven, or taken by a cycle) is not deleted, its row leaves the `purged`
ledger if step 3 had written it, and it is counted `skipped_moved_since`.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import Transaction
from pydantic import Field, field_validator

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.durations import parse_duration
from poison_pipeline.domain.names import AppTransaction
from poison_pipeline.domain.paths import action_id_part
from poison_pipeline.domain.routing import FAILED_AT
from poison_pipeline.operations.actions import (
    Action,
    Recorded,
    committed,
    default_actor,
    find_action,
    new_action_id,
    operator_writer,
    planned_actions,
    reused_id,
    table_version,
)
from poison_pipeline.operations.groups import group_id, group_key
from poison_pipeline.operations.redrive import still_in_place
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
from poison_pipeline.storage.plans import read_plan
from poison_pipeline.storage.tables import PURGED, QueueTables
from poison_pipeline.storage.writer import QueueWriter

SAMPLE = 5
KIND = "purge"
RETENTION_ACTOR = "poison_pipeline"


class PurgeError(ValueError):
    """A purge that cannot run as asked; the message names the argument and what is wrong."""


@dataclass
class PurgeResult:
    purge_id: str
    queue: str
    table: str
    dry_run: bool
    older_than_seconds: float
    cutoff: datetime  # failed before this: now - older_than (or --failed-before, if earlier)
    selected: int = 0  # what the filters took
    purged: int = 0  # deleted for good (would be, for a dry run)
    # A completion's: planned, but no longer where the plan found them (redriven, taken by a cycle): kept.
    skipped_moved_since: int = 0
    # Planned by an interrupted redrive (or edit) that has not removed them from the table yet: kept.
    skipped_held: int = 0
    held_by: list[str] = field(default_factory=list)  # those interrupted actions
    already_done: bool = False  # this id completed before: nothing deleted now
    resumed: list[str] = field(default_factory=list)  # interrupted purges completed first
    by_group: dict[str, int] = field(default_factory=dict)
    by_message_type: dict[str, int] = field(default_factory=dict)
    sample_ids: list[str] = field(default_factory=list)
    oldest_failure: datetime | None = None
    newest_failure: datetime | None = None
    actor: str | None = None
    action_id: str | None = None


class PurgeOptions(Filters):
    """What a purge takes besides its queue: the run config of a queue's purge job in Dagster."""

    table: FailureTable = Field(description="Where the messages are: poison, dead_letter or quarantine.")
    older_than: str = Field(description="Failed more than this long ago: 30d, 12h, 90m, PT1H or seconds.")
    confirm: bool = Field(default=False, description="Delete for good; without it, only report what would be "
                          "deleted (the preview).")
    id: ActionId = Field(default=None, description="The purge's id; default: a new one. Run again with it, "
                         "an interrupted purge completes.")

    @field_validator("older_than", mode="before")
    @classmethod
    def _age(cls, value: object) -> object:
        # Seconds may come as a number (YAML, Python); an age is kept as the text the operator wrote.
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("older_than")
    @classmethod
    def _non_negative(cls, value: str) -> str:
        if parse_duration(value) < timedelta(0):
            raise ValueError(f"{value!r}: give an age of zero or more (e.g. 30d)")
        return value


class PurgeRequest(PurgeOptions):
    """A purge: the selected failed messages of one table of a queue, deleted for good."""

    queue: str = Field(description="The queue whose failed messages are purged.")


def purge(declaration: Declaration, request: PurgeRequest, context: ActionContext | None = None) -> PurgeResult:
    """Delete for good (with `confirm`; else report what would be deleted) the messages of the
    request's table that failed more than `older_than` ago and match its filters. Raises PurgeError or
    SelectionError, before anything is written, for a request that cannot run."""
    context = context or ActionContext()
    return purge_table(declaration, request.queue, request.table, request.older_than, request.selection(),
                       dry_run=not request.confirm, purge_id=request.id, actor=context.actor,
                       run_id=context.run_id, now=context.now)


def _bounded(selection: Selection, cutoff: datetime) -> tuple[Selection, datetime]:
    """The selection with the age as a failure-time bound (the earlier of it and --failed-before)."""
    before = min(cutoff, selection.failed_before) if selection.failed_before else cutoff
    fields = {**selection.__dict__, "failed_before": before}
    return Selection(**fields), before


def purge_table(declaration: Declaration, queue: str, table: str, older_than: timedelta | str | float,
                selection: Selection | None = None, *, dry_run: bool = False, purge_id: str | None = None,
                actor: str | None = None, run_id: str = "manual", now: datetime | None = None) -> PurgeResult:
    """Delete for good the messages of `queue`'s `table` (poison, dead_letter or quarantine) that
    failed more than `older_than` ago and match `selection`: a validated request's purge, or the
    retention's. Raises PurgeError or SelectionError, before anything is written, for a request the
    lake refuses; a dry run writes nothing at all."""
    if queue not in declaration.queues:
        raise PurgeError(f"no queue {queue!r} is declared; declared: {', '.join(declaration.queues)}")
    try:
        check_table(table)
    except SelectionError as error:
        raise PurgeError(f"--table {error}") from None
    if (given := action_id_part(purge_id, PurgeError)) is not None and \
            (why := reused_id(declaration, given, queue, KIND)) is not None:
        raise PurgeError(why)
    age = parse_duration(older_than)
    now = now or datetime.now(UTC)
    bounded, cutoff = _bounded(selection or Selection(), now - age)
    # An empty time range, a `--where` that is no predicate or another bad filter fails here: before
    # any table is created or the lease taken.
    selection_filter(bounded, table)
    arguments = {"queue": queue, "table": table, "older_than_seconds": age.total_seconds(),
                 "cutoff": cutoff.isoformat(), "selection": (selection or Selection()).arguments()}
    tables = QueueTables.of(declaration, queue)
    actor = actor or default_actor()
    if dry_run:
        taken, held_by, held = _not_held(tables, table, selected(declaration, queue, table, bounded))
        rows = _ledger_rows(taken, table, purge_id or "dry-run", now)
        result = _summary(rows, purge_id or "(dry run)", queue, table, True, age, cutoff, actor)
        result.skipped_held, result.held_by = held, held_by
        return result
    tables.ensure()
    with operator_writer(declaration, tables, KIND, run_id, resuming=[purge_id] if purge_id else []) as writer:
        resumed = list(writer.completed_actions)
        if purge_id is not None and (record := Recorded.of(writer, KIND, purge_id)).action is not None:
            result = _resume(declaration, record)
            result.resumed = resumed
            return result
        purge_id = purge_id or new_action_id(KIND)
        record = Recorded(writer, KIND, purge_id)
        taken, held_by, held = _not_held(tables, table, selected(declaration, queue, table, bounded))
        rows = _ledger_rows(taken, table, purge_id, now)
        result = _summary(rows, purge_id, queue, table, False, age, cutoff, actor)
        result.resumed, result.skipped_held, result.held_by = resumed, held, held_by
        if rows.num_rows == 0:
            return result  # nothing to purge: no table changes, nothing recorded
        record.begin(actor, {**arguments, "id": purge_id}, _touched(tables, table), run_id, now)
        record.record_plan(rows, {table: table_version(tables, table)})
        _commit(record, rows, None, fresh=True)
        result.action_id = purge_id
        return result


def _not_held(tables: QueueTables, table: str, rows: pa.Table) -> tuple[pa.Table, list[str], int]:
    """The selected rows but those an interrupted redrive (or an edit's) planned to move from
    `table`: it may have sent their copies already, and completing it removes them here. Purged
    meanwhile, a message would be both purged and back in a queue. Also the actions that hold some,
    and how many rows they hold."""
    held: set[tuple[str, str | None]] = set()
    held_by = []
    for action in planned_actions(tables, ["redrive"]):
        plan = read_plan(tables, "redrive", action.action_id) if action.arguments.get("from") == table else None
        if plan is not None and plan.rows.num_rows:
            held.update(zip(plan.rows["message_id"].to_pylist(), plan.rows["source_batch_id"].to_pylist(), strict=True))
            held_by.append(action.action_id)
    if not held:
        return rows, [], 0
    keep = pa.array([pair not in held for pair in zip(rows["message_id"].to_pylist(), rows["batch_id"].to_pylist(),
                                                       strict=True)], pa.bool_())
    kept = rows.filter(keep)
    return kept, held_by, rows.num_rows - kept.num_rows


def _touched(tables: QueueTables, table: str) -> list[tuple[QueueTables, str]]:
    return [(tables, table), (tables, PURGED)]


def _ledger_rows(rows: pa.Table, table: str, purge_id: str, now: datetime) -> pa.Table:
    return ledger_rows(rows, table, purge_id, now, schemas.PURGED, "purged_at")


def ledger_rows(rows: pa.Table, table: str, action_id: str, now: datetime, schema: pa.Schema,
                at_column: str) -> pa.Table:
    """A ledger row per failed row of `table` an action takes (`purged`, `archived`): where it was,
    its failure group, and when and by which action it was taken (`at_column`)."""
    n = rows.num_rows
    reasons = rows["reason"].to_pylist() if "reason" in rows.column_names else [None] * n
    return pa.table({
        "message_id": rows["message_id"], "conversation_id": rows["conversation_id"],
        "message_type": rows["message_type"], "from_table": pa.array([table] * n, pa.string()),
        "batch_id": rows["batch_id"], "failed_at": rows[FAILED_AT[table]],
        "last_error_signature": rows["last_error_signature"],
        "failure_group": pa.array([group_id(group_key(sig, reason)) for sig, reason in zip(
            rows["last_error_signature"].to_pylist(), reasons, strict=True)], pa.string()),
        at_column: pa.array([now] * n, schemas.TS), "action_id": pa.array([action_id] * n, pa.string()),
    }).cast(schema)


def _commit(record: Recorded, rows: pa.Table, version: int | None, fresh: bool) -> pa.Table:
    """Steps 3 to 5, each safe to repeat, for the planned `rows` (read from the table at `version`);
    `fresh` when they were read under this lease a moment ago. Returns the ledger rows purged."""
    writer, action = record.writer, record.action
    assert action is not None  # begun before its plan
    tables = writer.tables
    table = action.arguments["table"]
    ledger_app, removal_app = AppTransaction.action(action.action_id), AppTransaction.removed(action.action_id)
    removed = committed(tables.open(table), removal_app)
    if fresh:
        in_place = rows
    elif removed:  # the removal committed: what it left in the table was never this purge's
        in_place = rows.slice(0, 0)
    else:
        in_place = still_in_place(tables, table, rows, "batch_id", version)
    of_this = pads.field("action_id") == action.action_id
    if not committed(tables.open(PURGED), ledger_app):
        writer.append(PURGED, in_place, app_id=ledger_app.name, version=1)
        purged = in_place
    else:
        purged = tables.open(PURGED).to_pyarrow_dataset().to_table(filter=of_this)
        if not removed:
            # Written to the ledger, then taken from the table by another action before this one
            # removed it: it is where that action put it, not purged.
            moved = pc.invert(pc.is_in(purged["message_id"], value_set=in_place["message_id"]))
            stale = purged.filter(moved)
            if stale.num_rows:
                writer.replace_batches(PURGED, set(stale["batch_id"].to_pylist()),
                                       keep=~(of_this & pads.field("message_id").isin(stale["message_id"].to_pylist())))
            purged = purged.filter(pc.invert(moved))
    if in_place.num_rows:
        _remove(writer, table, in_place, Transaction(removal_app.name, 1))
    record.finish({"selected": rows.num_rows, "purged": purged.num_rows,
                   "skipped_moved_since": rows.num_rows - purged.num_rows}, _touched(tables, table))
    return purged


def _remove(writer: QueueWriter, table: str, rows: pa.Table, mark: Transaction) -> None:
    """Remove `rows` from `table` in one commit that carries `mark`."""
    batches = sorted(set(rows["batch_id"].to_pylist()), key=lambda b: (b is None, b or ""))
    writer.replace_batches(table, batches, keep=~pads.field("message_id").isin(rows["message_id"].to_pylist()),
                           also=[mark])


def finish_interrupted(declaration: Declaration, writer: QueueWriter, action: Action) -> pa.Table:
    """Complete purge `action`, left `planned` by a kill; call holding the queue's lease. Returns
    the ledger rows of what it purged."""
    tables = writer.tables
    record = Recorded(writer, KIND, action.action_id, action)
    plan = record.plan()
    if plan is None:  # killed before its plan was written: it deleted nothing; plan it as recorded
        args = action.arguments
        bounded = Selection(**{**_selection_of(args["selection"]).__dict__,
                               "failed_before": datetime.fromisoformat(args["cutoff"])})
        rows = _ledger_rows(selected(declaration, tables.queue, args["table"], bounded), args["table"],
                            action.action_id, action.at)
        record.record_plan(rows, {args["table"]: table_version(tables, args["table"])})
        return _commit(record, rows, None, fresh=True)
    rows = plan.rows.cast(schemas.PURGED)
    return _commit(record, rows, plan.versions.get(action.arguments["table"]), fresh=False)


def _selection_of(arguments: dict[str, Any]) -> Selection:
    """The Selection that `Selection.arguments()` recorded."""
    values: dict[str, Any] = dict(arguments)
    for moment in ("failed_after", "failed_before"):
        if moment in values:
            values[moment] = datetime.fromisoformat(values[moment])
    if "ids" in values:
        values["ids"] = tuple(values["ids"])
    return Selection(**values)


def _resume(declaration: Declaration, record: Recorded) -> PurgeResult:
    writer, action = record.writer, record.action
    assert action is not None  # recorded: that is what is resumed
    tables = writer.tables
    args = action.arguments
    age, cutoff = timedelta(seconds=args["older_than_seconds"]), datetime.fromisoformat(args["cutoff"])
    if record.finished:
        record.clear()  # killed after it was recorded done
        result = PurgeResult(action.action_id, args["queue"], args["table"], False, age.total_seconds(), cutoff,
                             already_done=True, actor=action.actor, action_id=action.action_id)
        return result
    rows = finish_interrupted(declaration, writer, action)
    result = _summary(rows, action.action_id, args["queue"], args["table"], False, age, cutoff, action.actor)
    recorded = find_action(tables, action.action_id)
    result.selected = int(recorded.counts.get("selected", rows.num_rows)) if recorded else rows.num_rows
    result.skipped_moved_since = result.selected - rows.num_rows
    result.action_id = action.action_id
    return result


def _summary(rows: pa.Table, purge_id: str, queue: str, table: str, dry_run: bool, age: timedelta,
             cutoff: datetime, actor: str) -> PurgeResult:
    failed = rows["failed_at"].to_pylist()
    groups = rows["failure_group"].to_pylist()
    return PurgeResult(
        purge_id, queue, table, dry_run, age.total_seconds(), cutoff,
        selected=rows.num_rows, purged=rows.num_rows,
        by_group=dict(Counter(groups).most_common()),
        by_message_type=dict(Counter(rows["message_type"].to_pylist()).most_common()),
        sample_ids=rows["message_id"].to_pylist()[:SAMPLE],
        oldest_failure=min(failed) if failed else None, newest_failure=max(failed) if failed else None,
        actor=actor,
    )


def result_json(result: PurgeResult) -> dict[str, Any]:
    """The stable JSON of a purge (README, "Operators")."""
    stable: dict[str, Any] = json.loads(json.dumps(asdict(result), default=lambda v: v.isoformat()))
    return stable
