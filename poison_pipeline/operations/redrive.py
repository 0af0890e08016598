"""`redrive`: send failed messages from poison, dead_letter or quarantine back to an inbound queue.

A redrive has an id: given (`--id`), or new at every invocation, so the same command run twice is
two redrives. An id another queue's actions ledger records is refused (the target's app
transactions below are namespaced by the source queue as well). It runs under the source queue's
lease, once the queue's cycles a kill left staged are finished:

1. recorded `planned` in the source queue's actions ledger;
2. its plan (the rows it takes, with their new counts and due times, and the version of the source
   it read them from) committed to the queue's `plans` table (storage/plans.py), so a run killed at
   any point and started again with the same id moves at most the same messages;
3. the rows appended to the target's inbound, one chunk of due times at a time, each chunk under the
   app transaction (source queue, redrive id, chunk number): a replay skips the chunks committed;
4. the rows removed from the source once the target's log shows their chunk committed: from then on
   the copies are the target's, wherever its cycles and commands take them. No command restores an
   inbound; after a RESTORE of the target's inbound run by hand (which can take an append back while
   its app transaction stays), only those whose copies are found in the target (in its inbound under
   the redrive's batch, or where a cycle of the target took them since) leave the source: a chunk
   committed whose messages are nowhere in the target is a loud RedriveError, and those messages
   stay in the source;
5. recorded `done` with its counts; the plan is removed. Run again after that, it moves nothing.

A replay (the same id after a kill, or a cycle completing the interrupted redrive) moves only the
messages still where the plan found them (the source table, the same batch): one that left since (a
purge, a cycle of the source, another redrive) is not sent, and is counted `skipped_moved_since`.

Redriven messages keep their message id; their per-cycle counts (abort, move) start afresh so the
whole policy applies again, while the lifetime totals are kept and `redrive_count` goes up by one.
A redrive may replace the body and headers of messages it sends back (`replace`: what `edit` does);
the replacement is part of the plan, so a replay sends exactly the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from pydantic import Field, field_validator, model_validator

from poison_pipeline.domain.bounds import bounded_count, bounded_rate, spread_problem
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.names import ActionName, AppTransaction, BatchName
from poison_pipeline.domain.paths import action_id_part
from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, INBOUND, PROCESSED, QUARANTINE
from poison_pipeline.operations.actions import (
    ABANDONED,
    Action,
    Recorded,
    default_actor,
    find_action,
    new_action_id,
    operator_writer,
    reused_id,
    table_version,
)
from poison_pipeline.operations.groups import UnknownGroup, group_id, group_key, locate_group
from poison_pipeline.operations.ramp import RAMP, RampResult, start_ramp, step_sizes
from poison_pipeline.operations.requests import ActionContext, ActionId, failure_table, not_blank
from poison_pipeline.operations.selection import (
    Filters,
    Selection,
    SelectionError,
    check_table,
    selected_at,
    selection_filter,
)
from poison_pipeline.storage import schemas
from poison_pipeline.storage.intake import ensure_intake, record_intake
from poison_pipeline.storage.plans import read_plan
from poison_pipeline.storage.tables import PURGED, QueueTables
from poison_pipeline.storage.writer import Committer, LeaseFreeAppender, QueueWriter

SAMPLE = 5
KIND = "redrive"


class RedriveError(ValueError):
    """A redrive that cannot run as asked; the message names the argument and what is wrong."""


@dataclass(frozen=True)
class Replacement:
    """What an edited message is sent back with instead of its failed body and headers."""

    body: bytes
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class TableRedrive:
    """One source table's redrive, as its action records it."""

    queue: str
    source: str
    to: str
    selection: Selection = Selection()
    rate: float | None = None  # messages per second released to the target
    limit: int | None = None
    force: bool = False  # past the loop guard (policy max_redrives)
    replace: tuple[tuple[str, Replacement], ...] = ()  # message id -> its new body and headers

    def arguments(self) -> dict[str, Any]:
        arguments: dict[str, Any] = {"queue": self.queue, "from": self.source, "to": self.to,
                     "selection": self.selection.arguments(), "rate": self.rate, "limit": self.limit,
                     "force": self.force}
        if self.replace:
            arguments["replaced"] = sorted(mid for mid, _ in self.replace)
        return arguments

    def as_recorded(self, recorded: dict[str, Any]) -> TableRedrive:
        """The request an action recorded: run again by its id, an interrupted redrive completes what it
        planned, from where and to where it planned it, whatever this call asks (the replacements
        are this call's: an action records only whose body it replaced)."""
        return TableRedrive(recorded["queue"], recorded["from"], recorded["to"],
                            Selection.of_arguments(recorded.get("selection") or {}), recorded.get("rate"),
                            recorded.get("limit"), bool(recorded.get("force")), self.replace)


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
    # A replay's: planned, but no longer where the plan found them (purged, taken by a cycle): not sent.
    skipped_moved_since: int = 0
    already_done: bool = False  # this id completed before: nothing moved now
    by_group: dict[str, int] = field(default_factory=dict)
    by_message_type: dict[str, int] = field(default_factory=dict)
    sample_ids: list[str] = field(default_factory=list)
    first_due: datetime | None = None
    last_due: datetime | None = None
    action_id: str | None = None
    abandoned: bool = False  # with already_done: closed by a cycle, killed before it planned anything
    # Run again with the id of an interrupted redrive: the arguments it recorded that this call differed
    # from (the recorded ones were used), e.g. {"to": "qb"}.
    as_recorded: dict[str, Any] = field(default_factory=dict)
    # The version of the source table the selection read (with as_of_version: that version).
    source_version: int | None = None
    # A dry run with a ramp: how many each step would send, in order.
    ramp_steps: list[int] = field(default_factory=list)


class RedriveOptions(Filters):
    """What a redrive takes besides its queue: the run config of a queue's redrive asset in Dagster."""

    source_tables: list[str] = Field(default_factory=lambda: list(FAILURE_TABLES), description="The tables the "
                                     "failed messages are taken from: poison, dead_letter, quarantine (one or more).")
    to: str | None = Field(default=None, description="Another declared queue whose inbound receives them; "
                           "default: the queue's own.")
    rate: float | None = Field(default=None, description="Release this many messages a second (their due "
                               "times), shared by the source tables; default: all due now.")
    limit: int | None = Field(default=None, description="Move at most this many messages in all.")
    force: bool = Field(default=False, description="Also send messages redriven max_redrives times already "
                        "(the loop guard).")
    dry_run: bool = Field(default=False, description="Say what would move; change nothing.")
    id: ActionId = Field(default=None, description="The redrive's id; default: a new one. Run again with it, "
                         "an interrupted redrive completes as it was recorded. With several source tables, "
                         "each has its own: the id and the table (r1--poison).")

    @field_validator("source_tables")
    @classmethod
    def _sources(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"{value!r}: name one or more of {', '.join(FAILURE_TABLES)}")
        for table in value:
            failure_table(table)
        if len(set(value)) != len(value):
            raise ValueError(f"{value!r}: a table is named twice")
        return value

    ramp: list[str] | None = Field(default=None, description="Send in steps that grow (1,10,100,all: the first 1, "
                                   "then up to 10 in all, ...), each once a cycle took the one before, stopping when "
                                   "more than max_failures of a step fail again with the same signature.")
    max_failures: int = Field(default=0, ge=0, description="With ramp: how many of a step's messages may fail "
                              "again before the ramp stops and parks them.")

    @field_validator("ramp", mode="before")
    @classmethod
    def _ramp_text(cls, value: object) -> object:
        # "1,10,100,all", as the command line writes it, or a list (YAML, Python).
        if isinstance(value, str):
            return [part.strip() for part in value.split(",")]
        return [str(v) for v in value] if isinstance(value, list) else value

    @field_validator("ramp")
    @classmethod
    def _growing(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            ramp_steps(value)
        return value

    @property
    def steps(self) -> list[int | None] | None:
        """The ramp's steps as cumulative sizes (None: all the rest)."""
        return None if self.ramp is None else ramp_steps(self.ramp)

    @model_validator(mode="after")
    def _ramp_alone(self) -> Self:
        if self.ramp is None:
            return self
        if len(self.source_tables) > 1:
            raise ValueError("a ramp takes one source table (each step waits for the one before)")
        for name in ("to", "rate", "limit"):
            if getattr(self, name) is not None:
                raise ValueError(f"a ramp redrives into its own queue, a step at a time: not with {name}")
        return self

    @model_validator(mode="after")
    def _one_table_per_version(self) -> Self:
        if self.selection().as_of_version is not None and len(self.source_tables) > 1:
            raise ValueError(f"a version is one table's: give as_of_version (or a group@version) with one source "
                             f"table, not {', '.join(self.source_tables)}")
        return self

    @field_validator("rate", mode="before")
    @classmethod
    def _per_second(cls, value: object) -> object:
        return value.removesuffix("/s") if isinstance(value, str) else value  # "50/s", as the help writes it

    @field_validator("rate")
    @classmethod
    def _bounded_rate(cls, value: float | None) -> float | None:
        return None if value is None else bounded_rate(value)

    @field_validator("limit")
    @classmethod
    def _positive_limit(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{value!r}: give a positive number of messages")
        return None if value is None else bounded_count(value, 1)

    @field_validator("max_failures")
    @classmethod
    def _bounded_failures(cls, value: int) -> int:
        return bounded_count(value)

    @model_validator(mode="after")
    def _spread_of_the_limit(self) -> Self:
        # Known at the door when a limit is given; otherwise once the selection is counted.
        if self.rate is not None and self.limit is not None and (why := spread_problem(self.limit, self.rate)):
            raise ValueError(why)
        return self

    @field_validator("to")
    @classmethod
    def _to(cls, value: str | None) -> str | None:
        return not_blank(value)


class RedriveRequest(RedriveOptions):
    """A redrive: the selected failed messages of a queue's source tables back to an inbound."""

    queue: str = Field(description="The queue whose failed messages are redriven.")


@dataclass
class RedriveReport:
    """A redrive's outcome, one result per source table that was redriven (or previewed)."""

    results: list[RedriveResult]
    # A ramp's progress (redrive --ramp): its steps are redrives of their own, sent as it goes.
    ramp: RampResult | None = None

    @property
    def moved(self) -> int:
        return sum(r.moved for r in self.results)

    @property
    def selected(self) -> int:
        return sum(r.selected for r in self.results)

    @property
    def already_done(self) -> bool:
        return bool(self.results) and all(r.already_done for r in self.results)


def redrive(declaration: Declaration, request: RedriveRequest, context: ActionContext | None = None) -> RedriveReport:
    """Send the selected failed messages of `request.queue`'s source tables back to an inbound.

    Every source table is checked before anything is written, so a bad filter changes nothing. A
    rate is shared by the tables that have something to move; a limit counts the messages of all of
    them. With a ramp, the first step is sent and the queue's cycles go on with it (`ramp` in the
    report). Raises RedriveError or SelectionError for a request that cannot run."""
    context = context or ActionContext()
    sources = _sources(declaration, request)
    selection = request.selection()
    for source in sources:
        selection_filter(selection, source)
    if request.steps is not None and not request.dry_run:
        _checked(declaration, TableRedrive(request.queue, sources[0], request.queue, selection, None, None,
                                           request.force, ()))
        if (given := action_id_part(request.id, RedriveError)) is not None and \
                (why := reused_id(declaration, given, request.queue, RAMP)) is not None:
            raise RedriveError(why)
        return RedriveReport([], start_ramp(declaration, request.queue, sources[0], selection, request.steps,
                                            request.max_failures, given, context.actor, context.run_id, context.now))

    def one(source: str, *, dry_run: bool, rate: float | None, limit: int | None) -> RedriveResult:
        redrive_id = request.id if request.id is None or len(request.source_tables) == 1 else \
            str(ActionName.parse(request.id).of_source(source))
        return _completed_counts(declaration, request.queue, redrive_table(
            declaration, request.queue, source, selection, to=request.to, dry_run=dry_run, rate=rate,
            limit=limit, redrive_id=redrive_id, force=request.force, actor=context.actor, run_id=context.run_id,
            now=context.now, progress=context.progress))

    rate = request.rate
    if request.dry_run or (rate is not None and len(sources) > 1):
        previews = [one(s, dry_run=True, rate=None, limit=request.limit) for s in sources]
        if rate is not None:
            rate /= max(1, sum(1 for p in previews if p.moved))
            # Each table gets a share of the rate: every share is checked before the first is sent
            # (and a dry run says what the redrive would).
            for preview in previews:
                if (why := spread_problem(preview.moved, rate)) is not None:
                    raise RedriveError(why if len(sources) == 1 else
                                       f"{why} (that is each table's share of --rate {request.rate:g}/s, shared by "
                                       f"{', '.join(sources)})")
        if request.dry_run:
            if request.steps is not None:
                previews[0].ramp_steps = step_sizes(request.steps, previews[0].moved)
            return RedriveReport(previews)
    results: list[RedriveResult] = []
    remaining = request.limit
    for source in sources:
        if remaining == 0:
            break
        result = one(source, dry_run=False, rate=rate, limit=remaining)
        results.append(result)
        remaining = None if remaining is None else remaining - result.moved
    return RedriveReport(results)


def ramp_steps(values: list[str]) -> list[int | None]:
    """A ramp's steps, written 1,10,100,all: positive sizes that grow, `all` (the rest) only last."""
    steps: list[int | None] = []
    for number, text in enumerate(values):
        if text == "all" and number == len(values) - 1:
            steps.append(None)
            continue
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{','.join(values)!r}: {text!r} is not a step: write sizes that grow, e.g. 1,10,100,all "
                             "(all only last)")
        try:
            bounded_count(int(text), 1)
        except ValueError as error:
            raise ValueError(f"{','.join(values)!r}: step {error}") from None
        if steps and int(text) <= (steps[-1] or 0):
            raise ValueError(f"{','.join(values)!r}: each step must send more than the one before ({text} after "
                             f"{steps[-1]})")
        steps.append(int(text))
    if not steps:
        raise ValueError("a ramp has one step at least, e.g. 1,10,100,all")
    return steps


def _sources(declaration: Declaration, request: RedriveRequest) -> list[str]:
    """The source tables to take from: with a group, those of them that have rows of it."""
    if request.group is None or len(request.source_tables) == 1:
        return list(request.source_tables)
    try:
        found = {g.table for g in locate_group(declaration, request.group, request.queue)}
    except UnknownGroup as error:
        if error.gone:  # its messages left: nothing to take, as with one source table
            return list(request.source_tables)
        raise SelectionError(f"--group {error}") from None
    sources = [t for t in request.source_tables if t in found]
    if not sources:
        raise SelectionError(f"--group {request.group!r}: its rows are in {', '.join(sorted(found))} of queue "
                             f"{request.queue!r}, none in the source tables {', '.join(request.source_tables)}")
    return sources


def _completed_counts(declaration: Declaration, queue: str, result: RedriveResult) -> RedriveResult:
    """A redrive run again after it completed moves nothing; what it did then is in its action."""
    if not result.already_done:
        return result
    action = find_action(QueueTables.of(declaration, queue), result.redrive_id)
    counts = action.counts if action is not None else {}
    return dataclasses.replace(result, selected=counts.get("selected", 0), moved=counts.get("moved", 0),
                   skipped_processed=counts.get("skipped_processed", 0),
                   skipped_loop_guard=counts.get("skipped_loop_guard", 0),
                   skipped_limit=counts.get("skipped_limit", 0))


def redrive_table(declaration: Declaration, queue: str, source: str, selection: Selection | None = None, *,
                  to: str | None = None, dry_run: bool = False, rate: float | None = None,
                  limit: int | None = None, redrive_id: str | None = None, force: bool = False,
                  actor: str | None = None, run_id: str = "manual", now: datetime | None = None,
                  replace: dict[str, Replacement] | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  within: QueueWriter | None = None) -> RedriveResult:
    """Send the selected failed messages of `queue`'s `source` table to the inbound of `to` (default:
    `queue`): one table's redrive, as `redrive` and `edit` run it (their requests validated).
    Raises RedriveError or SelectionError, before anything is written, for a request the lake refuses.
    `progress(moved, total)` hears of each chunk appended (a terminal shows a bar).
    `replace` gives new bodies and headers by message id (what `edit` does). `within`: the writer
    of a caller that holds the queue's lease already (an edit, a completion of interrupted work)."""
    replacements = tuple(sorted((replace or {}).items()))
    request = _checked(declaration, TableRedrive(queue, source, to or queue, selection or Selection(),
                                                 rate, limit, force, replacements))
    given = action_id_part(redrive_id, RedriveError)
    if given is not None and (why := reused_id(declaration, given, queue, KIND)) is not None:
        raise RedriveError(why)
    redrive_id = given or new_action_id(KIND)
    tables = QueueTables.of(declaration, queue)
    _check_spread(declaration, request, tables, redrive_id, now or datetime.now(UTC))
    if dry_run:
        # Nothing is written, not even the tables a first redrive would create.
        return _summary(_plan(declaration, request, tables, redrive_id, now or datetime.now(UTC)), request,
                        redrive_id, True)
    tables.ensure()
    with operator_writer(declaration, tables, "redrive", run_id, resuming=[redrive_id], within=within) as writer:
        return _run(declaration, request, writer, redrive_id, actor or default_actor(), run_id,
                    now or datetime.now(UTC), progress or (lambda moved, total: None))


def _checked(declaration: Declaration, request: TableRedrive) -> TableRedrive:
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
    return request


def _check_spread(declaration: Declaration, request: TableRedrive, tables: QueueTables, redrive_id: str,
                  now: datetime) -> None:
    """Refuse a rate too slow for the messages it would release before anything is written (not
    even the lease): from the table's row count when that is few enough, else by planning."""
    if request.rate is None:
        return
    try:
        bounded_rate(request.rate)
    except ValueError as error:  # a caller of the Python API that skipped the request's validation
        raise RedriveError(f"--rate {error}") from None
    held = tables.stats(request.source, now).rows if tables.exists(request.source) else 0
    if spread_problem(held if request.limit is None else min(held, request.limit), request.rate) is not None:
        _plan(declaration, request, tables, redrive_id, now)  # raises RedriveError if it still is too slow


@dataclass
class _Plan:
    rows: pa.Table  # what moves, as inbound rows (batch ids set per chunk), plus `source_batch_id`
    selected: int
    skipped_processed: int
    skipped_loop_guard: int
    skipped_limit: int
    source_version: int | None


def _plan(declaration: Declaration, request: TableRedrive, tables: QueueTables, redrive_id: str,
          now: datetime) -> _Plan:
    rows, version = selected_at(declaration, request.queue, request.source, request.selection)
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
    if request.rate is not None and (why := spread_problem(rows.num_rows, request.rate)) is not None:
        raise RedriveError(why)
    return _Plan(_as_inbound(rows, request, redrive_id, now), total, skipped_processed, skipped_guard,
                 skipped_limit, version)


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


def _as_inbound(rows: pa.Table, request: TableRedrive, redrive_id: str, now: datetime) -> pa.Table:
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
                                 pa.array([str(BatchName.chunk(redrive_id, c)) for c in chunks], pa.string()))
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


def planned_rows(tables: QueueTables, redrive_id: str) -> pa.Table | None:
    """What redrive `redrive_id` planned to move, while it is not done (None: no plan recorded)."""
    plan = read_plan(tables, KIND, redrive_id)
    return None if plan is None else plan.rows


def app_id(source_queue: str, redrive_id: str, planned: pa.Table | None = None) -> str:
    """The app transaction of a redrive's appends to its target (domain/names.py). A plan an earlier
    version wrote (its batches in the earlier form) completes under the name it began with."""
    legacy = planned is not None and planned.num_rows > 0 and BatchName.is_legacy(str(planned["batch_id"][0]))
    return AppTransaction.redrive(source_queue, redrive_id, legacy=legacy).name


def _run(declaration: Declaration, request: TableRedrive, writer: QueueWriter, redrive_id: str, actor: str,
         run_id: str, now: datetime, progress: Callable[[int, int], None]) -> RedriveResult:
    tables = writer.tables
    record = Recorded.of(writer, KIND, redrive_id)
    if record.finished:
        record.clear()  # killed after it was recorded done
        assert record.action is not None
        return RedriveResult(redrive_id, request.queue, request.source, request.to, False, already_done=True,
                             action_id=redrive_id, abandoned=record.action.state == ABANDONED)
    asked = request.arguments()
    if record.action is not None:
        # Sent elsewhere, a completion would leave the copies the interrupted run sent in its target.
        request = request.as_recorded(record.action.arguments)
    differs = {k: v for k, v in request.arguments().items() if asked.get(k) != v}
    target = QueueTables.of(declaration, request.to)
    touched = [(tables, request.source), (target, INBOUND)]
    plan = record.plan() if record.action is not None else None
    if plan is None:
        fresh = _plan(declaration, request, tables, redrive_id, now)
        if fresh.rows.num_rows == 0 and record.action is None:
            return _summary(fresh, request, redrive_id, False)  # nothing to move: no table changes
        record.begin(actor, {**request.arguments(), "id": redrive_id}, touched, run_id, now)
        rows, counts = fresh.rows, _plan_counts(fresh)
        record.record_plan(rows.append_column("plan_counts", pa.array([json.dumps(counts)] * rows.num_rows)),
                           {request.source: table_version(tables, request.source)})
        in_place = rows  # read under the lease a moment ago: nothing moved since
    else:
        rows = plan.rows
        counts = json.loads(rows["plan_counts"][0].as_py()) if rows.num_rows else {}
        in_place = still_in_place(tables, request.source, rows, "source_batch_id",
                                  plan.versions.get(request.source))
    assert record.action is not None  # begun above, or recorded by the run this one completes
    moved = _send(writer, target, request, redrive_id, in_place, rows, now, progress,
                  since=record.action.version_before(target, INBOUND))
    skipped = rows.num_rows - moved.num_rows
    result = _summary_of(moved, counts, request, redrive_id, False)
    result.skipped_moved_since = skipped
    record.finish({**counts, "moved": moved.num_rows, "skipped_moved_since": skipped}, touched)
    result.action_id = redrive_id
    result.as_recorded = differs
    return result


def still_in_place(tables: QueueTables, table: str, rows: pa.Table, batch_column: str,
                   version: int | None) -> pa.Table:
    """The planned `rows` still where the plan found them: in `table`, in the same batch
    (`batch_column` of the plan). A table still at the version the plan read is the fast answer."""
    if rows.num_rows == 0 or (version is not None and table_version(tables, table) == version):
        return rows
    now = tables.open(table).to_pyarrow_dataset().to_table(
        columns=["message_id", "batch_id"],
        filter=pads.field("message_id").isin(pa.array(sorted(set(rows["message_id"].to_pylist())), pa.string())))
    there = set(zip(now["message_id"].to_pylist(), now["batch_id"].to_pylist(), strict=True))
    return rows.filter(pa.array([pair in there for pair in zip(
        rows["message_id"].to_pylist(), rows[batch_column].to_pylist(), strict=True)], pa.bool_()))


def _send(writer: QueueWriter, target: QueueTables, request: TableRedrive, redrive_id: str,
          in_place: pa.Table, planned: pa.Table, now: datetime, progress: Callable[[int, int], None], *,
          since: int | None) -> pa.Table:
    """Append the rows still in place to the target, chunk by chunk, and remove from the source those
    whose copies verifiably landed in the target; returns the planned rows this redrive moved (by this
    run or by the interrupted one it completes). `since`: the target inbound's version when the
    redrive began (None: not recorded)."""
    tables = writer.tables
    if planned.num_rows == 0:
        return planned
    target.ensure()
    app = app_id(tables.queue, redrive_id, planned)
    elsewhere = target.queue != tables.queue
    # Into another queue's inbound without its lease, as an enqueue; into its own, fenced.
    into: Committer = LeaseFreeAppender(target) if elsewhere else writer
    if elsewhere:
        ensure_intake(into, now)
        ensure_intake(writer, now)
    inbound = in_place.select(schemas.MESSAGE.names)
    sent = 0
    for chunk in sorted(set(in_place["chunk"].to_pylist())):
        part = inbound.filter(pc.equal(in_place["chunk"], chunk))
        into.append(INBOUND, part, app_id=app, version=chunk + 1)
        if elsewhere:  # a move between queues: one queue's intake is the other's outflow
            batch = part["batch_id"][0].as_py()  # the plan's, in the form it was planned with
            record_intake(into, f"redrive from {tables.queue}", batch, part.num_rows, now, app, chunk + 1)
            record_intake(writer, f"redrive to {target.queue}", batch, -part.num_rows, now, app, chunk + 1)
        sent += part.num_rows
        progress(sent, in_place.num_rows)
    committed = target.open(INBOUND).transaction_version(app) or 0
    if since is not None and not _restored_since(target, since):
        # No append was taken back: a chunk the log shows committed landed, and its copies are the
        # target's own since, wherever its cycles and commands took them (another batch of its
        # inbound, its archive, another queue): a search of the target could miss them.
        landed = _appended(planned, committed)["message_id"].unique()
    else:
        landed = _landed(target, planned, committed, (tables.queue, request.source))
    verified = in_place.filter(pc.is_in(in_place["message_id"], value_set=landed))
    _remove_from_source(writer, request.source, verified)
    unverified = sorted(set(in_place["message_id"].to_pylist()) - set(landed.to_pylist()))
    if unverified:
        raise RedriveError(
            f"redrive {redrive_id}: {target.describe(INBOUND)} records the chunks of {len(unverified)} message(s) "
            f"as committed (app transaction {app}), yet they are nowhere in queue {target.queue!r}: they are left "
            f"in {tables.queue}/{request.source} and the redrive stays planned "
            f"({', '.join(unverified[:10])}{' ...' if len(unverified) > 10 else ''})")
    return planned.filter(pc.is_in(planned["message_id"], value_set=landed))


def _appended(planned: pa.Table, committed: int) -> pa.Table:
    """The planned rows whose chunk the target's log shows appended (`committed`: the version of the
    redrive's app transaction there)."""
    return planned.filter(pc.less_equal(pc.add(planned["chunk"], 1), committed))


def _restored_since(target: QueueTables, version: int) -> bool:
    """Whether a Delta RESTORE of the target's inbound was committed after `version` (-1: since it was
    created). No command restores an inbound (a redrive's undo compensates); one run by hand can take
    an append back while its app transaction stays."""
    inbound = target.open(INBOUND)
    newer = inbound.version() - version
    return newer > 0 and any(entry.get("operation") == "RESTORE" for entry in inbound.history(newer))


def _landed(target: QueueTables, planned: pa.Table, committed: int, source: tuple[str, str]) -> pa.Array:
    """After a RESTORE of the target's inbound: the ids of the planned rows whose chunk its log shows
    appended and whose copy is found in the target: in its inbound under the chunk's batch, or, for
    one a cycle took since, in another of its tables or its processed ledger (a copy in the
    redrive's own source row does not count)."""
    appended = _appended(planned, committed)
    if appended.num_rows == 0:
        return pa.array([], pa.string())
    ids = pa.array(sorted(set(appended["message_id"].to_pylist())), pa.string())
    planned_at = dict(zip(appended["message_id"].to_pylist(), appended["batch_id"].to_pylist(), strict=True))
    came_from = dict(zip(appended["message_id"].to_pylist(), appended["source_batch_id"].to_pylist(), strict=True))
    found: set[str] = set()
    for table in (*target.waiting, DEAD_LETTER, QUARANTINE):
        if not target.exists(table):
            continue
        rows = target.open(table).to_pyarrow_dataset().to_table(
            columns=["message_id", "batch_id"], filter=pads.field("message_id").isin(ids))
        for message_id, batch in zip(rows["message_id"].to_pylist(), rows["batch_id"].to_pylist(), strict=True):
            if batch == planned_at[message_id] if table == INBOUND else \
                    (target.queue, table) != source or batch != came_from[message_id]:
                found.add(message_id)
    for ledger in (PROCESSED, PURGED):
        if target.exists(ledger):
            found |= set(target.open(ledger).to_pyarrow_dataset().to_table(
                columns=["message_id"], filter=pads.field("message_id").isin(ids))["message_id"].to_pylist())
    return pa.array(sorted(found), pa.string())


def _remove_from_source(writer: QueueWriter, source: str, rows: pa.Table) -> None:
    if rows.num_rows == 0:
        return
    tables = writer.tables
    ids = rows["message_id"].to_pylist()
    batches = sorted({b for b in rows["source_batch_id"].to_pylist()}, key=lambda b: (b is None, b or ""))
    within = pads.field("message_id").isin(ids)
    still = tables.open(source).to_pyarrow_dataset().head(1, columns=["message_id"], filter=within)
    if still.num_rows:  # a replay after the removal finds nothing left and commits nothing
        writer.replace_batches(source, batches, keep=~within)


def _plan_counts(plan: _Plan) -> dict[str, int]:
    return {"selected": plan.selected, "skipped_processed": plan.skipped_processed,
            "skipped_loop_guard": plan.skipped_loop_guard, "skipped_limit": plan.skipped_limit,
            **({} if plan.source_version is None else {"source_version": plan.source_version})}


def _summary(plan: _Plan, request: TableRedrive, redrive_id: str, dry_run: bool) -> RedriveResult:
    return _summary_of(plan.rows, _plan_counts(plan), request, redrive_id, dry_run)


def _summary_of(rows: pa.Table, counts: dict[str, int], request: TableRedrive, redrive_id: str,
                dry_run: bool) -> RedriveResult:
    due = rows["due_at"].to_pylist()
    groups = rows["group"].to_pylist()
    return RedriveResult(
        redrive_id, request.queue, request.source, request.to, dry_run,
        selected=counts.get("selected", 0), moved=rows.num_rows,
        skipped_processed=counts.get("skipped_processed", 0), skipped_loop_guard=counts.get("skipped_loop_guard", 0),
        skipped_limit=counts.get("skipped_limit", 0), source_version=counts.get("source_version"),
        by_group=dict(Counter(groups).most_common()),
        by_message_type=dict(Counter(rows["message_type"].to_pylist()).most_common()),
        sample_ids=rows["message_id"].to_pylist()[:SAMPLE],
        first_due=min(due) if due else None, last_due=max(due) if due else None,
    )


def complete_interrupted_redrive(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> None:
    """A redrive a kill left planned, completed by its queue's next holder as it was recorded."""
    args = action.arguments
    redrive_table(declaration, writer.tables.queue, args["from"], to=args["to"], redrive_id=action.action_id,
                  actor=action.actor, run_id=run_id, within=writer)
