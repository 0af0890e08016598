"""`redrive`: send failed messages from poison, dead_letter or quarantine back to an inbound queue.

A redrive has an id (given, or derived from its arguments). It runs under the source queue's lease:

1. recorded `planned` in the source queue's actions ledger;
2. its plan (the rows it takes, with their new counts and due times) written once to the lake, so a
   run killed at any point and started again with the same id moves exactly the same messages;
3. the rows appended to the target's inbound, one chunk of due times at a time, each chunk under the
   app transaction (redrive id, chunk number): a replay skips the chunks already committed;
4. the rows removed from the source (a replay finds nothing left to remove);
5. recorded `done` with its counts; the plan is deleted. Run again after that, it moves nothing.

Redriven messages keep their message id; their per-cycle counts (abort, move) start afresh so the
whole policy applies again, while the lifetime totals are kept and `redrive_count` goes up by one.
A redrive may replace the body and headers of messages it sends back (`replace`: what `edit` does);
the replacement is part of the plan, so a replay sends exactly the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.paths import operator_id
from poison_pipeline.domain.routing import INBOUND, PROCESSED
from poison_pipeline.operations.actions import DONE, begin_action, default_actor, find_action, finish_action
from poison_pipeline.operations.groups import group_id, group_key
from poison_pipeline.operations.render import breakdown, when
from poison_pipeline.operations.selection import Selection, SelectionError, check_table, selected, selection_filter
from poison_pipeline.storage import schemas
from poison_pipeline.storage.intake import ensure_intake, record_intake
from poison_pipeline.storage.journal import read_plan, remove_tree, write_plan
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Committer, LeaseFreeAppender, QueueWriter, queue_writer

SAMPLE = 5


class RedriveError(ValueError):
    """A redrive that cannot run as asked; the message names the argument and what is wrong."""


@dataclass(frozen=True)
class Replacement:
    """What an edited message is sent back with instead of its failed body and headers."""

    body: bytes
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RedriveRequest:
    queue: str
    source: str
    to: str
    selection: Selection = Selection()
    rate: float | None = None  # messages per second released to the target
    limit: int | None = None
    force: bool = False  # past the loop guard (policy max_redrives)
    replace: tuple[tuple[str, Replacement], ...] = ()  # message id -> its new body and headers

    def arguments(self) -> dict[str, Any]:
        arguments = {"queue": self.queue, "from": self.source, "to": self.to,
                     "selection": self.selection.arguments(), "rate": self.rate, "limit": self.limit,
                     "force": self.force}
        if self.replace:
            arguments["replaced"] = sorted(mid for mid, _ in self.replace)
        return arguments

    def default_id(self) -> str:
        digest = hashlib.sha256(json.dumps(self.arguments(), sort_keys=True).encode()).hexdigest()
        return f"redrive-{digest[:12]}"


@dataclass
class RedriveResult:
    redrive_id: str
    queue: str
    source: str
    target: str
    dry_run: bool
    selected: int = 0
    moved: int = 0  # would move, for a dry run
    skipped_processed: int = 0  # already in the target's processed ledger: left where they are
    skipped_loop_guard: int = 0  # redriven max_redrives times already: left where they are
    skipped_limit: int = 0
    already_done: bool = False  # this id completed before: nothing moved now
    by_group: dict[str, int] = field(default_factory=dict)
    by_message_type: dict[str, int] = field(default_factory=dict)
    sample_ids: list[str] = field(default_factory=list)
    first_due: datetime | None = None
    last_due: datetime | None = None
    action_id: str | None = None


def redrive(declaration: Declaration, queue: str, source: str, selection: Selection | None = None, *,
            to: str | None = None, dry_run: bool = False, rate: float | None = None, limit: int | None = None,
            redrive_id: str | None = None, force: bool = False, actor: str | None = None,
            run_id: str = "manual", now: datetime | None = None,
            replace: dict[str, Replacement] | None = None,
            progress: Callable[[int, int], None] | None = None) -> RedriveResult:
    """Send the selected failed messages of `queue`'s `source` table to the inbound of `to` (default:
    `queue`). Raises RedriveError or SelectionError, before anything is written, for a bad request.
    `progress(moved, total)` hears of each chunk appended (a terminal shows a bar).
    `replace` gives new bodies and headers by message id (what `edit` does); an edit calls it
    holding the queue's lease already, which the same thread re-enters."""
    replacements = tuple(sorted((replace or {}).items()))
    request = _checked(declaration, RedriveRequest(queue, source, to or queue, selection or Selection(),
                                                   rate, limit, force, replacements))
    redrive_id = operator_id(redrive_id, RedriveError) or request.default_id()
    tables = QueueTables.of(declaration, queue)
    if dry_run:
        # Nothing is written, not even the tables a first redrive would create.
        return _summary(_plan(declaration, request, tables, redrive_id, now or datetime.now(UTC)), request,
                        redrive_id, True)
    tables.ensure()
    with queue_writer(tables, "redrive", run_id) as writer:
        return _run(declaration, request, writer, redrive_id, actor or default_actor(), run_id,
                    now or datetime.now(UTC), progress or (lambda moved, total: None))


def _checked(declaration: Declaration, request: RedriveRequest) -> RedriveRequest:
    for name in (request.queue, request.to):
        if name not in declaration.queues:
            raise RedriveError(f"no queue {name!r} is declared; declared: {', '.join(declaration.queues)}")
    try:
        check_table(request.source)
    except SelectionError as error:
        raise RedriveError(f"--from {error}") from None
    # A bad filter (an empty time range, a `--where` that is no predicate) changes nothing: not even
    # the tables a first redrive creates, nor the lease.
    selection_filter(request.selection, request.source)
    if request.rate is not None and not (request.rate > 0 and math.isfinite(request.rate)):
        raise RedriveError(f"--rate {request.rate!r}: give a positive number of messages per second")
    if request.limit is not None and request.limit < 1:
        raise RedriveError(f"--limit {request.limit!r}: give a positive number of messages")
    return request


@dataclass
class _Plan:
    rows: pa.Table  # what moves, as inbound rows (batch ids set per chunk), plus `source_batch_id`
    selected: int
    skipped_processed: int
    skipped_loop_guard: int
    skipped_limit: int


def _plan(declaration: Declaration, request: RedriveRequest, tables: QueueTables, redrive_id: str,
          now: datetime) -> _Plan:
    rows = selected(declaration, request.queue, request.source, request.selection)
    total = rows.num_rows
    processed = _already_processed(QueueTables.of(declaration, request.to), rows["message_id"])
    rows = rows.filter(pc.invert(pc.is_in(rows["message_id"], value_set=processed)))
    skipped_processed = total - rows.num_rows
    guard = declaration.queue(request.queue).policy.max_redrives
    before_guard = rows.num_rows
    if not request.force:
        rows = rows.filter(pc.less(pc.fill_null(rows["redrive_count"], 0), guard))
    skipped_guard = before_guard - rows.num_rows
    skipped_limit = 0
    if request.limit is not None and rows.num_rows > request.limit:
        skipped_limit = rows.num_rows - request.limit
        rows = rows.slice(0, request.limit)
    return _Plan(_as_inbound(rows, request, redrive_id, now), total, skipped_processed, skipped_guard,
                 skipped_limit)


def _already_processed(target: QueueTables, ids: pa.ChunkedArray) -> pa.Array:
    if not target.exists(PROCESSED) or len(ids) == 0:
        return pa.array([], pa.string())
    done = target.open(PROCESSED).to_pyarrow_dataset().to_table(
        columns=["message_id"],
        filter=pads.field("message_id").isin(ids.to_pylist()) & (pads.field("disposition") == "processed"))
    return pc.unique(done["message_id"].combine_chunks())


def _due_times(count: int, rate: float | None, now: datetime) -> list[datetime]:
    if rate is None:
        return [now] * count
    return [now + timedelta(seconds=i / rate) for i in range(count)]


def _chunks(due: list[datetime], rate: float | None, now: datetime) -> list[int]:
    """The chunk of each message: a cycle takes a file when its last message is due, so a rate
    needs files released one after another; about a hundred at most, ten seconds each at least."""
    if rate is None or not due:
        return [0] * len(due)
    span = (due[-1] - now).total_seconds()
    width = max(10.0, span / 100)
    return [int((d - now).total_seconds() // width) for d in due]


def _as_inbound(rows: pa.Table, request: RedriveRequest, redrive_id: str, now: datetime) -> pa.Table:
    due = _due_times(rows.num_rows, request.rate, now)
    chunks = _chunks(due, request.rate, now)
    lifetimes = [None if exp is None or enq is None else exp - enq
                 for exp, enq in zip(rows["expires_at"].to_pylist(), rows["enqueued_at"].to_pylist(), strict=True)]
    redrives = pc.add(pc.fill_null(rows["redrive_count"], 0), 1)
    inbound = schemas.project(
        rows.set_column(rows.schema.get_field_index("redrive_count"), "redrive_count", redrives),
        schemas.MESSAGE, abort_count=0, move_count=0, entered_at=now)
    inbound = inbound.set_column(inbound.schema.get_field_index("due_at"), "due_at", pa.array(due, schemas.TS))
    # A fresh lifetime, as long as the first: an expired message sent back would expire again at once.
    inbound = inbound.set_column(inbound.schema.get_field_index("expires_at"), "expires_at",
                                 pa.array([None if life is None else now + life for life in lifetimes], schemas.TS))
    inbound = inbound.set_column(inbound.schema.get_field_index("batch_id"), "batch_id",
                                 pa.array([f"{redrive_id}-{c}" for c in chunks], pa.string()))
    reasons = rows["reason"].to_pylist() if "reason" in rows.column_names else [None] * rows.num_rows
    groups = [group_id(group_key(signature, reason))
              for signature, reason in zip(rows["last_error_signature"].to_pylist(), reasons, strict=True)]
    if request.replace:
        inbound = _replaced(inbound, dict(request.replace))
    return inbound.append_column("source_batch_id", rows["batch_id"]).append_column(
        "chunk", pa.array(chunks, pa.int32())).append_column("group", pa.array(groups, pa.string()))


def _replaced(rows: pa.Table, replace: dict[str, Replacement]) -> pa.Table:
    ids = rows["message_id"].to_pylist()
    bodies = [replace[m].body if m in replace else b for m, b in zip(ids, rows["body"].to_pylist(), strict=True)]
    headers = [list(replace[m].headers) if m in replace else h
               for m, h in zip(ids, rows["headers"].to_pylist(), strict=True)]
    rows = rows.set_column(rows.schema.get_field_index("body"), "body", pa.array(bodies, pa.binary()))
    return rows.set_column(rows.schema.get_field_index("headers"), "headers",
                           pa.array(headers, rows.schema.field("headers").type))


def _plan_uri(tables: QueueTables, redrive_id: str) -> str:
    return tables.work_uri("redrive", redrive_id, "plan.parquet")


def planned_rows(tables: QueueTables, redrive_id: str) -> pa.Table | None:
    """What redrive `redrive_id` planned to move, while it is not done (None: no plan written)."""
    return read_plan(_plan_uri(tables, redrive_id))


def _run(declaration: Declaration, request: RedriveRequest, writer: QueueWriter, redrive_id: str, actor: str,
         run_id: str, now: datetime, progress: Callable[[int, int], None]) -> RedriveResult:
    tables = writer.tables
    target = QueueTables.of(declaration, request.to)
    touched = [(tables, request.source), (target, INBOUND)]
    recorded = find_action(tables, redrive_id)
    if recorded is not None and recorded.state == DONE:
        remove_tree(tables.work_uri("redrive", redrive_id), tables.storage_options)  # killed after it was recorded done
        return RedriveResult(redrive_id, request.queue, request.source, request.to, False, already_done=True,
                             action_id=redrive_id)
    uri = _plan_uri(tables, redrive_id)
    rows = planned_rows(tables, redrive_id) if recorded is not None else None
    if rows is None:
        plan = _plan(declaration, request, tables, redrive_id, now)
        if plan.rows.num_rows == 0 and recorded is None:
            return _summary(plan, request, redrive_id, False)  # nothing to move: no table changes
        action = recorded or begin_action(writer, "redrive", actor, {**request.arguments(), "id": redrive_id},
                                          touched, action_id=redrive_id, run_id=run_id, now=now)
        rows, counts = plan.rows, _plan_counts(plan)
        write_plan(uri, rows.append_column("plan_counts", pa.array([json.dumps(counts)] * rows.num_rows)))
    else:
        action = recorded
        counts = json.loads(rows["plan_counts"][0].as_py()) if rows.num_rows else {}
    result = _summary_of(rows, counts, request, redrive_id, False)
    if rows.num_rows:
        target.ensure()
        app_id = f"poison_pipeline/{redrive_id}"
        inbound = rows.select(schemas.MESSAGE.names)
        chunks = rows["chunk"].to_pylist()
        moved = 0
        elsewhere = target.queue != tables.queue
        # Into another queue's inbound without its lease, as an enqueue; into its own, fenced.
        into: Committer = LeaseFreeAppender(target) if elsewhere else writer
        if elsewhere:
            ensure_intake(into, now)
            ensure_intake(writer, now)
        for chunk in sorted(set(chunks)):
            part = inbound.filter(pc.equal(rows["chunk"], chunk))
            into.append(INBOUND, part, app_id=app_id, version=chunk + 1)
            if elsewhere:  # a move between queues: one queue's intake is the other's outflow
                batch = f"{redrive_id}-{chunk}"
                record_intake(into, f"redrive from {tables.queue}", batch, part.num_rows, now, app_id, chunk + 1)
                record_intake(writer, f"redrive to {target.queue}", batch, -part.num_rows, now, app_id, chunk + 1)
            moved += part.num_rows
            progress(moved, rows.num_rows)
        _remove_from_source(writer, request.source, rows)
    finish_action(writer, action, {**counts, "moved": rows.num_rows}, touched)
    remove_tree(tables.work_uri("redrive", redrive_id), tables.storage_options)
    result.action_id = action.action_id
    return result


def _remove_from_source(writer: QueueWriter, source: str, rows: pa.Table) -> None:
    tables = writer.tables
    ids = rows["message_id"].to_pylist()
    batches = sorted({b for b in rows["source_batch_id"].to_pylist()}, key=lambda b: (b is None, b or ""))
    within = pads.field("message_id").isin(ids)
    still = tables.open(source).to_pyarrow_dataset().head(1, columns=["message_id"], filter=within)
    if still.num_rows:  # a replay after the removal finds nothing left and commits nothing
        writer.replace_batches(source, batches, keep=~within)


def _plan_counts(plan: _Plan) -> dict[str, int]:
    return {"selected": plan.selected, "skipped_processed": plan.skipped_processed,
            "skipped_loop_guard": plan.skipped_loop_guard, "skipped_limit": plan.skipped_limit}


def _summary(plan: _Plan, request: RedriveRequest, redrive_id: str, dry_run: bool) -> RedriveResult:
    return _summary_of(plan.rows, _plan_counts(plan), request, redrive_id, dry_run)


def _summary_of(rows: pa.Table, counts: dict[str, int], request: RedriveRequest, redrive_id: str,
                dry_run: bool) -> RedriveResult:
    due = rows["due_at"].to_pylist()
    groups = rows["group"].to_pylist()
    return RedriveResult(
        redrive_id, request.queue, request.source, request.to, dry_run,
        selected=counts.get("selected", 0), moved=rows.num_rows,
        skipped_processed=counts.get("skipped_processed", 0), skipped_loop_guard=counts.get("skipped_loop_guard", 0),
        skipped_limit=counts.get("skipped_limit", 0),
        by_group=dict(Counter(groups).most_common()),
        by_message_type=dict(Counter(rows["message_type"].to_pylist()).most_common()),
        sample_ids=rows["message_id"].to_pylist()[:SAMPLE],
        first_due=min(due) if due else None, last_due=max(due) if due else None,
    )


def format_redrive(result: RedriveResult) -> str:
    verb = "would move" if result.dry_run else "moved"
    head = (f"redrive {result.redrive_id}: {result.queue}/{result.source} -> {result.target}/inbound: "
            f"{verb} {result.moved} of {result.selected} selected")
    if result.already_done:
        return (f"redrive {result.redrive_id} already completed: nothing moved now "
                "(give another --id to redrive again)")
    lines = [head + (" (dry run: no table changed)" if result.dry_run else "")]
    for count, why in ((result.skipped_processed, "already processed by the target (its ledger): left in place"),
                       (result.skipped_loop_guard, "redriven max_redrives times already: left in place "
                                                   "(--force to send them anyway)"),
                       (result.skipped_limit, "beyond --limit: left in place")):
        if count:
            lines.append(f"  skipped {count}: {why}")
    if result.moved and result.first_due != result.last_due:
        lines.append(f"  released from {when(result.first_due)} to {when(result.last_due)} (--rate)")
    if result.moved:
        lines += breakdown(result.by_group, result.by_message_type, result.sample_ids)
    return "\n".join(lines)
