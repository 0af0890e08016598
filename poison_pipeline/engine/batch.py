"""The per-message work of a cycle, as an Arrow-batch function that Spark runs on its executors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.envelope import Envelope, Message
from poison_pipeline.domain.errors import Classifier
from poison_pipeline.domain.imports import import_callable
from poison_pipeline.domain.outage import OutageDetector
from poison_pipeline.domain.policy import Ordering, PoisonQueuePolicy, Policy
from poison_pipeline.domain.routing import (
    OUTAGE,
    POISON,
    PROCESSED_ROUTE,
    STAY,
    Outcome,
    Route,
    cycle_number,
    cycle_of,
    moves_back,
    route_before_delivery,
    route_held,
    route_joined,
    route_main,
    route_poison,
    waiting_tables,
)
from poison_pipeline.engine import output, watchdog
from poison_pipeline.engine.bisection import deliver_batch
from poison_pipeline.engine.changes import Changes
from poison_pipeline.engine.delivery import Delivery, Made, attempt, deliver
from poison_pipeline.handlers import batch_size
from poison_pipeline.storage import schemas
from poison_pipeline.storage.inflight import Marker
from poison_pipeline.storage.lease import LeaseGuard

# The batch columns in which a big cycle marks its duplicates, messages of ended conversations and
# conversations waiting elsewhere (engine/dedup.py, engine/screening.py) instead of sets in the spec:
# nothing per message is collected on the driver.
DUPLICATE_COLUMN = "_duplicate"
ENDED_COLUMN = "_ended"
BLOCKED_COLUMNS = ("_blocked_table", "_blocked_sequence", "_blocked_due")


@dataclass(frozen=True)
class Blocked:
    """Where a conversation's earliest waiting message is, when it is not in the cycle's table."""

    table: str
    sequence_number: int
    due_at: datetime


@dataclass(frozen=True)
class CycleSpec:
    """Everything an executor needs to process its share of a cycle; pickled to the workers."""

    queue: str
    table: str
    policy: Policy
    poison: PoisonQueuePolicy
    handler: str | None
    now: datetime
    out_batch: str
    seen: frozenset[str] = frozenset()
    losers: frozenset[tuple[str, str]] = frozenset()
    ended: frozenset[str] = frozenset()
    blocked: dict[str, Blocked] = field(default_factory=dict)
    # Set on the careful re-run after a worker died: where each task marks the message in flight,
    # and how each of this cycle's attempts of a message that killed its worker ended
    # (delivery.CRASH, or delivery.TIMEOUT when the watchdog killed it).
    inflight: str | None = None
    crashed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Checked before every attempt: a worker whose cycle lost its lease stops delivering.
    guard: LeaseGuard | None = None
    # A probe (engine/cycle.py): try this many messages, return every other one uncharged, and
    # count the first failure pointing at a dependency as the outage going on.
    probe: int = 0
    # The last retry subqueue of the queue's waiting tables (QueueTables.last_retry): beyond the
    # policy's when one left by a declaration with more retry cycles still drains.
    last_retry: int = 0
    # The lake's (QueueTables.storage_options): the in-flight markers and the staged results are
    # files under its root. Required, so that no delivery opens them without.
    storage_options: dict[str, str] = field(kw_only=True, repr=False)  # credentials: never in a repr

    @property
    def is_poison(self) -> bool:
        return self.table == POISON

    @property
    def ordered(self) -> bool:
        return self.policy.ordering is Ordering.CONVERSATION

    @property
    def attempts_per_cycle(self) -> int:
        count = self.poison.receive_retry_count if self.is_poison else self.policy.receive_retry_count
        return count + 1

    @property
    def timeout_seconds(self) -> float | None:
        timeout = self.poison.handler_timeout if self.is_poison else self.policy.handler_timeout
        return timeout.total_seconds() if timeout else None

    @property
    def cycle(self) -> int:
        return cycle_number(self.table, self.policy)


def python_timestamps(column: pa.Array) -> list[datetime | None]:
    """A UTC timestamp column as aware datetimes."""
    # Converting naive values and attaching UTC costs half of converting tz-aware ones.
    return [None if v is None else v.replace(tzinfo=UTC) for v in column.cast(_NAIVE).to_pylist()]


def python_headers(column: pa.Array) -> dict[int, list[tuple[str, str]]]:
    """The headers of the rows that have any, by row: most messages have none, and a Python list
    per row that the whole batch keeps alive makes the garbage collector rescan them all."""
    offsets = column.offsets  # of a map column: list_value_length has no kernel for maps
    lengths = pc.subtract(offsets[1:], offsets[:-1])
    rows = pc.indices_nonzero(pc.and_(column.is_valid(), pc.greater(lengths, 0)))
    if len(rows) == 0:
        return {}
    return dict(zip(rows.to_pylist(), pc.take(column, rows).to_pylist(), strict=True))


def with_every_column(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with the message columns a delivery job left out (those null in every due file,
    engine/staging.stage_on_spark) restored as nulls."""
    missing = [f for f in schemas.MESSAGE if batch.schema.get_field_index(f.name) < 0]
    if not missing:
        return batch
    return pa.RecordBatch.from_arrays([*batch.columns, *(pa.nulls(batch.num_rows, f.type) for f in missing)],
                                      names=[*batch.schema.names, *(f.name for f in missing)])


_NAIVE = pa.timestamp("us")
_PLAIN_COLUMNS = [
    "message_id", "conversation_id", "sequence_number", "message_type", "body", "encoding", "sender",
    "abort_count", "total_abort_count", "move_count", "redrive_count", "batch_id",
]


def _optional(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else None


class _Rows:
    """The columns of one Arrow batch a cycle reads, as Python values."""

    def __init__(self, batch: pa.RecordBatch, now: datetime) -> None:
        self.columns = {name: batch.column(name).to_pylist() for name in _PLAIN_COLUMNS}
        self.headers = python_headers(batch.column("headers"))
        self.enqueued = python_timestamps(batch.column("enqueued_at"))
        self.expires = python_timestamps(batch.column("expires_at"))
        expired = pc.less_equal(batch.column("expires_at"), pa.scalar(now, schemas.TS))
        self.expired: list[bool] = pc.fill_null(expired, False).to_pylist()
        # Read once or twice per message: plain attributes, not a lookup in `columns` each time.
        c = self.columns
        self.message_id, self.conversation_id, self.sequence_number = (
            c["message_id"], c["conversation_id"], c["sequence_number"])
        self.abort_count, self.total_abort_count = c["abort_count"], c["total_abort_count"]
        self.move_count, self.redrive_count = c["move_count"], c["redrive_count"]
        self.duplicate = _optional(batch, DUPLICATE_COLUMN)
        self.ended = _optional(batch, ENDED_COLUMN)
        self.blocked: dict[str, Blocked] | None = None
        tables = _optional(batch, BLOCKED_COLUMNS[0])
        if tables is not None:
            heads = zip(self.columns["conversation_id"], tables, batch.column(BLOCKED_COLUMNS[1]).to_pylist(),
                        python_timestamps(batch.column(BLOCKED_COLUMNS[2])), strict=True)
            self.blocked = {c: Blocked(t, n, d) for c, t, n, d in heads if t is not None}  # type: ignore[arg-type]


_SUCCEEDED = Outcome.SUCCEEDED  # read once per message: a module constant, not an enum lookup


def _one_of(batch_handler: Callable[[list[Message]], Any]) -> Callable[[Message], Any]:
    return lambda message: batch_handler([message])


class Processor:
    """Decides the route of every message of a partition, in its order; instances live on the
    executors. With conversation ordering the partition comes sorted by conversation and sequence."""

    def __init__(self, spec: CycleSpec) -> None:
        self.spec = spec
        self.handler = import_callable(spec.handler) if spec.handler else None
        self.batch_size = batch_size(self.handler) if self.handler else None
        # Retry rules are the application queue's: the poison queue has its own counts.
        rules = () if spec.is_poison else spec.policy.rules
        self.classifier = Classifier(spec.policy.unrecoverable, spec.policy.outage_errors, spec.handler, rules)
        self.rule_attempts = tuple(p.receive_retry_count + 1 for p in spec.policy.under_rules) if rules else ()
        self.waiting_order = waiting_tables(spec.policy, spec.last_retry)
        self.waiting = frozenset(self.waiting_order)
        self._routes: dict[tuple[Outcome, bool, bool, int | None], Route] = {}
        self.outage = OutageDetector(1 if spec.probe else spec.policy.outage_threshold)
        self.probed = 0
        self.tripped = False
        # Messages settled since the last success whose fate an outage would undo.
        self.exposed: list[tuple[Changes, int]] = []
        # The conversation whose failed message holds the rest of it in this cycle, its route and due time.
        self.holding: tuple[str, Route, datetime | None] | None = None
        self.marker: Marker | None = None
        # Read once per message or attempt: kept as plain attributes, not recomputed properties.
        self.ordered = spec.ordered
        self.screening = bool(spec.seen or spec.losers or spec.ended)
        self.attempts = spec.attempts_per_cycle
        self.timeout = spec.timeout_seconds
        self.cycle = spec.cycle
        self.moves_back = moves_back(spec.table)
        self.queue = spec.queue
        self.crashed = spec.crashed
        self.guard = spec.guard
        # A batch handler delivers one message as a batch of one (on a careful re-run, so that a
        # dead worker names its message).
        self.one_handler = _one_of(self.handler) if self.handler is not None and self.batch_size else self.handler

    @property
    def careful(self) -> bool:
        """On a careful re-run (after a worker died), messages are marked in flight or some killed a worker."""
        return self.marker is not None or bool(self.crashed)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """One result per batch, in the order of the batches (engine/staging.py pairs them)."""
        # Here, not in __init__: this runs in the worker (a Spark executor's, or a small cycle's).
        self.marker = Marker(self.spec.inflight, self.spec.storage_options) if self.spec.inflight else None
        output.install()
        if self.timeout is not None and self.handler is not None:
            watchdog.prepare(self.marker.uri if self.marker is not None else None, self.spec.storage_options)
        # A batch is held back while an outage could still undo some of its routes.
        pending: list[tuple[pa.RecordBatch, Changes]] = []
        for batch in map(with_every_column, batches):
            pending.append((batch, self.process(batch)))
            if not self.exposed:
                yield from (changes.apply(b, self.spec.out_batch) for b, changes in pending)
                pending.clear()
        yield from (changes.apply(b, self.spec.out_batch) for b, changes in pending)
        if self.marker is not None:
            self.marker.clear()

    def process(self, batch: pa.RecordBatch) -> Changes:
        spec = self.spec
        rows = _Rows(batch, spec.now)
        changes = Changes(batch.num_rows, spec.table, self.waiting, spec.now)
        # Without screening, ordering or a batch handler, a message that is not expired is delivered
        # at once until an outage trips (what `_early` would decide, without asking it each time).
        screened = any(rows.duplicate or ()) or any(rows.ended or ())
        if spec.probe:
            self._probe(rows, batch.num_rows, changes)
            return changes
        if not (self.screening or screened or self.ordered or self.batch_size) and self.handler is not None:
            self._deliver(rows, range(batch.num_rows), changes)
            return changes
        deliverable: list[int] = []
        for i in range(batch.num_rows):
            if self._routed_early(rows, i, changes):
                continue
            if self.batch_size and self.spec.inflight is None:
                deliverable.append(i)
                if len(deliverable) == self.batch_size:
                    self._deliver_group(rows, deliverable, changes)
                    deliverable = []
            else:
                self._deliver(rows, (i,), changes)
        if deliverable:
            self._deliver_group(rows, deliverable, changes)
        return changes

    def _probe(self, rows: _Rows, count: int, changes: Changes) -> None:
        """A probe: its first `spec.probe` messages delivered one by one (a batch handler gets each
        as a batch of one), every other one returned where it was, uncharged and not attempted."""
        for i in range(count):
            if self._routed_early(rows, i, changes):
                continue
            if self.probed >= self.spec.probe:
                changes.uncharge(i)
                continue
            self.probed += 1
            self._deliver(rows, (i,), changes)

    def _routed_early(self, rows: _Rows, i: int, changes: Changes) -> bool:
        """Route row `i` if it is not delivered in this cycle (`_early`); say whether it was."""
        early = self._early(rows, i)
        if early is None:
            return False
        route, due, held = early
        changes.set(i, route, None, due)
        if held and self.exposed:
            self.exposed.append((changes, i))  # it follows a message an outage may undo
        return True

    def _early(self, rows: _Rows, i: int) -> tuple[Route, datetime | None, bool] | None:
        """The route of a message that is not delivered in this cycle (with its due time, and
        whether it is held behind an earlier message of its conversation), if it is one."""
        spec = self.spec
        conversation = rows.conversation_id[i]
        # Most messages are neither expired, duplicates, nor of an ended conversation: test cheaply.
        duplicate = rows.duplicate is not None and rows.duplicate[i]
        ended = rows.ended is not None and rows.ended[i]
        if rows.expired[i] or self.screening or duplicate or ended:
            message_id = rows.message_id[i]
            duplicate = duplicate or message_id in spec.seen or (message_id, rows.columns["batch_id"][i]) in spec.losers
            early = route_before_delivery(rows.expired[i], duplicate, ended or conversation in spec.ended)
            if early is not None:
                return early, None, False
        if self.tripped:
            return OUTAGE, None, False
        sequence = rows.sequence_number[i]
        # Messages without a sequence number take no part in ordering.
        if self.ordered and conversation is not None and sequence is not None:
            if self.holding is not None and self.holding[0] == conversation:
                return route_held(self.holding[1]), self.holding[2], True
            blocked = (spec.blocked if rows.blocked is None else rows.blocked).get(conversation)
            if blocked is not None and blocked.sequence_number < sequence:
                route = route_joined(blocked.table, self.waiting_order, spec.table)
                due = (blocked.due_at if route.destination != STAY
                       else spec.now + spec.policy.delay_before(self.cycle + 1, rows.message_id[i]))
                return route, due, False
        if self.handler is None:  # the poison queue's default reader: quarantine
            return route_poison(Outcome.EXHAUSTED, spec.poison, rows.expired[i]), None, False
        return None

    def _message(self, rows: _Rows, i: int, attempt: int) -> Message:
        """Row `i` as its handler receives it at `attempt`: a fresh envelope each time, so that what
        a handler changes in its message (headers, or anything forced) never reaches the next
        attempt; the stored row is the batch's, untouched."""
        if self.guard is not None:
            self.guard.check()
        c = rows.columns
        envelope = Envelope(rows.message_id[i], c["message_type"][i], c["body"][i] or b"", c["encoding"][i],
                            rows.enqueued[i], rows.conversation_id[i], rows.sequence_number[i],  # type: ignore[arg-type]
                            rows.expires[i], c["sender"][i], dict(rows.headers.get(i, ())))
        failed = attempt - 1
        return Message(envelope, self.queue, rows.abort_count[i] + failed, rows.move_count[i] + self.moves_back,
                       self.cycle, attempt, rows.total_abort_count[i] + failed, rows.redrive_count[i] or 0)

    def _deliver(self, rows: _Rows, indices: Iterable[int], changes: Changes) -> None:
        """Deliver rows one by one, in order. Rows not screened first (a batch delivered directly)
        are routed early here when expired, or once an outage has tripped."""
        # Bound once for the whole run of rows: this loop is where a big cycle spends its time.
        handler, timeout, make, succeeded = self.one_handler, self.timeout, self._message, changes.succeeded
        assert handler is not None
        expired, careful = rows.expired, self.careful
        for i in indices:
            if (expired[i] or self.tripped) and self._routed_early(rows, i, changes):
                continue
            if careful and (deaths := self._marked(rows.message_id[i])):
                self._retried(rows, i, changes, deaths=deaths)
                continue
            # Most messages succeed at their first attempt: it is made and recorded here, without the
            # bookkeeping of retries (a tenth of the cost of a message in this loop).
            message = make(rows, i, 1)
            first = attempt(handler, message, timeout)
            if first[2] is None:
                succeeded(i, first[0], first[1], message.outbox)
                if self.exposed:
                    self._recovered()
                continue
            self._retried(rows, i, changes, first=first)

    def _retried(self, rows: _Rows, i: int, changes: Changes, deaths: tuple[str, ...] = (),
                 first: Made | None = None) -> None:
        """The rest of a message's delivery, after its `first` attempt failed or its `deaths`, and its route."""
        assert self.one_handler is not None
        delivery = deliver(self.one_handler, lambda number: self._message(rows, i, number),
                           self.attempts, self.timeout, self.classifier, deaths=deaths, first=first,
                           rule_attempts=self.rule_attempts)
        self._settle(rows, i, delivery, changes)

    def _marked(self, message_id: str) -> tuple[str, ...]:
        """On a careful re-run: mark the message in flight before its delivery, and say how each of
        this cycle's attempts of it that killed its worker ended."""
        if self.marker is not None:
            self.marker.mark(message_id)
        return self.crashed.get(message_id, ())

    def _deliver_group(self, rows: _Rows, indices: list[int], changes: Changes) -> None:
        assert self.handler is not None
        deliveries = deliver_batch(
            self.handler,
            lambda k, attempt: self._message(rows, indices[k], attempt),
            len(indices), self.attempts, self.timeout, self.classifier, self.rule_attempts,
        )
        for i, delivery in zip(indices, deliveries, strict=True):
            self._settle(rows, i, delivery, changes)

    def _settle(self, rows: _Rows, i: int, delivery: Delivery, changes: Changes) -> None:
        """Route a delivered message, and let its outcome hold its conversation or trip the outage."""
        conversation = rows.conversation_id[i]
        if delivery.outcome is _SUCCEEDED:
            changes.set(i, PROCESSED_ROUTE, delivery)
            if self.exposed:
                self._recovered()
            return
        route = self._route(delivery.outcome, rows.expired[i], conversation is not None, delivery.rule)
        due = self._retry_due(route, delivery.rule, rows.message_id[i])
        changes.set(i, route, delivery, due)
        if self.ordered and conversation is not None and rows.sequence_number[i] is not None:
            self.holding = (conversation, route, due)
        if delivery.outage_failures and self.tripped:
            changes.uncharge(i)  # delivered in the same batch call as the message that tripped it
        elif delivery.outage_failures and self.outage.threshold:
            self.exposed.append((changes, i))
            if self.outage.failed():
                self._trip()

    def _recovered(self) -> None:
        """A success after failures an outage would have undone: they stand."""
        self.outage.succeeded()
        self.exposed.clear()

    def _trip(self) -> None:
        """An outage: every message failed since the last success goes back uncharged, and the rest
        of the partition is not attempted."""
        self.tripped = True
        for changes, index in self.exposed:
            changes.uncharge(index)
        self.exposed.clear()

    def _retry_due(self, route: Route, rule: int | None, message_id: str) -> datetime | None:
        """When a message moved to a retry subqueue is due: after the delay its policy (or the rule
        its failure fell under) gives that retry cycle. None elsewhere (`Changes` decides)."""
        if not route.destination.startswith("retry_"):
            return None
        return self.spec.now + self.spec.policy.under(rule).delay_before(cycle_of(route.destination), message_id)

    def _route(self, outcome: Outcome, expired: bool, conversation: bool, rule: int | None) -> Route:
        key = (outcome, expired, conversation, rule)
        route = self._routes.get(key)
        if route is None:
            spec = self.spec
            if spec.is_poison:
                route = route_poison(outcome, spec.poison, expired)
            else:
                route = route_main(spec.table, outcome, spec.policy.under(rule), expired, conversation)
            self._routes[key] = route
        return route
