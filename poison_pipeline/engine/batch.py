"""The per-message work of a cycle, as an Arrow-batch function that Spark runs on its executors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.envelope import Envelope, Message
from poison_pipeline.domain.errors import Classifier, ErrorInfo
from poison_pipeline.domain.imports import import_callable
from poison_pipeline.domain.policy import PoisonQueuePolicy, Policy
from poison_pipeline.domain.routing import (
    POISON,
    PROCESSED,
    STAY,
    Outcome,
    Route,
    cycle_number,
    route_before_delivery,
    route_main,
    route_poison,
)
from poison_pipeline.engine.delivery import AttemptRecord, Delivery, deliver
from poison_pipeline.storage import schemas


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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_poison(self) -> bool:
        return self.table == POISON

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


def _timestamps(column: pa.Array) -> list[datetime | None]:
    # Converting naive values and attaching UTC costs half of converting tz-aware ones.
    return [None if v is None else v.replace(tzinfo=UTC) for v in column.cast(_NAIVE).to_pylist()]


class _Changes:
    """What the cycle changes in each message of one Arrow batch, gathered row by row; the output
    batch is the input with only these columns replaced (SPEC section 6's count rules)."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self.failures: list[int] = []
        self.errors: list[ErrorInfo | None] = []
        self.offsets: list[int] = [0]
        self.attempts: list[AttemptRecord] = []

    def add(self, route: Route, delivery: Delivery | None) -> None:
        self.routes.append(route)
        if delivery is None:
            self.failures.append(0)
            self.errors.append(None)
        else:
            self.failures.append(delivery.failures)
            self.errors.append(delivery.last_error)
            self.attempts.extend(delivery.attempts)
        self.offsets.append(len(self.attempts))

    def apply(self, batch: pa.RecordBatch, spec: CycleSpec) -> pa.RecordBatch:
        destinations = [r.destination for r in self.routes]
        moved = pa.array([d.startswith("retry_") or d == POISON for d in destinations])
        processed = pa.array([d == PROCESSED for d in destinations])
        stay = pa.array([d == STAY for d in destinations])
        failures = pa.array(self.failures, pa.int32())
        now = pa.scalar(spec.now, schemas.TS)
        # A move between queues: MSMQ counts it and starts the abort count afresh.
        due = pa.array(
            [spec.now + spec.policy.retry_cycle_delay if d.startswith("retry_") else spec.now for d in destinations],
            schemas.TS,
        )
        columns = {
            "abort_count": pc.if_else(moved, 0, pc.add(batch.column("abort_count"), failures)),
            "total_abort_count": pc.add(batch.column("total_abort_count"), failures),
            "move_count": pc.add(batch.column("move_count"), pc.cast(moved, pa.int32())),
            "entered_at": pc.if_else(moved, now, batch.column("entered_at")),
            "due_at": pc.if_else(pc.or_(moved, stay), due, batch.column("due_at")),
            "batch_id": pc.if_else(processed, batch.column("batch_id"), pa.scalar(spec.out_batch)),
        }
        for name, attribute in _ERROR_COLUMNS.items():
            new = pa.array([getattr(e, attribute) if e is not None else None for e in self.errors], pa.string())
            columns[name] = pc.coalesce(new, batch.column(name))
        columns["destination"] = pa.array(destinations, pa.string())
        columns["disposition"] = pa.array([r.disposition.value for r in self.routes], pa.string())
        columns["reason"] = pa.array([r.reason for r in self.routes], pa.string())
        columns["attempts"] = self._attempts()
        arrays = []
        for f in schemas.RESULT:
            array = columns[f.name] if f.name in columns else batch.column(f.name)
            if f.name not in _LEDGER_COLUMNS:
                # The processed ledger keeps only ids and counts: blanking the rest (bodies above all)
                # for the bulk of the messages keeps the staged data small.
                array = pc.if_else(processed, pa.scalar(None, f.type), array)
            arrays.append(array)
        return pa.RecordBatch.from_arrays(arrays, schema=schemas.RESULT)

    def _attempts(self) -> pa.Array:
        records = self.attempts
        errors = [a.error for a in records]
        fields = [
            pa.array([a.attempt for a in records], pa.int32()),
            pa.array([a.started_us for a in records], schemas.TS),
            pa.array([a.duration_ms for a in records], pa.float64()),
            pa.array([a.outcome for a in records], pa.string()),
            *(pa.array([getattr(e, attr) if e is not None else None for e in errors], pa.string())
              for attr in _ERROR_COLUMNS.values()),
        ]
        values = pa.StructArray.from_arrays(fields, fields=schemas.ATTEMPT_FIELDS)
        return pa.ListArray.from_arrays(pa.array(self.offsets, pa.int32()), values)


_NAIVE = pa.timestamp("us")
_LEDGER_COLUMNS = frozenset(schemas.PROCESSED.names) | {"destination", "disposition", "reason", "attempts"}
_ERROR_COLUMNS = {
    "last_error_type": "type",
    "last_error_message": "message",
    "last_error_stack": "stack",
    "last_error_signature": "signature",
}


class Processor:
    """Decides the route of every message of a partition; instances live on the executors."""

    def __init__(self, spec: CycleSpec) -> None:
        self.spec = spec
        self.handler = import_callable(spec.handler) if spec.handler else None
        self.classifier = Classifier(spec.policy.unrecoverable)
        self._routes: dict[tuple[Outcome, bool], Route] = {}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield self.process(batch)

    def process(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        spec = self.spec
        expired = pc.fill_null(pc.less_equal(batch.column("expires_at"), pa.scalar(spec.now, schemas.TS)), False)
        columns = {name: batch.column(name).to_pylist() for name in _PLAIN_COLUMNS}
        enqueued = _timestamps(batch.column("enqueued_at"))
        expires = _timestamps(batch.column("expires_at"))
        changes = _Changes()
        for i, is_expired in enumerate(expired.to_pylist()):
            message_id = columns["message_id"][i]
            duplicate = message_id in spec.seen or (message_id, columns["batch_id"][i]) in spec.losers
            early = route_before_delivery(is_expired, duplicate)
            if early is not None:
                changes.add(early, None)
                continue
            if self.handler is None:  # the poison queue's default reader: quarantine
                changes.add(self._route(Outcome.EXHAUSTED, is_expired), None)
                continue
            envelope = Envelope(
                message_id=message_id,
                message_type=columns["message_type"][i],
                body=columns["body"][i] or b"",
                encoding=columns["encoding"][i],
                enqueued_at=enqueued[i],  # type: ignore[arg-type]
                conversation_id=columns["conversation_id"][i],
                sequence_number=columns["sequence_number"][i],
                expires_at=expires[i],
                sender=columns["sender"][i],
                headers=dict(columns["headers"][i] or ()),
            )
            delivery = self._deliver(envelope, columns["abort_count"][i], columns["move_count"][i])
            changes.add(self._route(delivery.outcome, is_expired), delivery)
        return changes.apply(batch, spec)

    def _deliver(self, envelope: Envelope, abort_count: int, move_count: int) -> Delivery:
        spec = self.spec
        assert self.handler is not None
        return deliver(
            self.handler,
            lambda attempt: Message(envelope, spec.queue, abort_count + attempt - 1, move_count, spec.cycle, attempt),
            spec.attempts_per_cycle,
            spec.timeout_seconds,
            self.classifier,
        )

    def _route(self, outcome: Outcome, expired: bool) -> Route:
        route = self._routes.get((outcome, expired))
        if route is None:
            spec = self.spec
            if spec.is_poison:
                route = route_poison(outcome, spec.poison, expired)
            else:
                route = route_main(spec.table, outcome, spec.policy, expired)
            self._routes[(outcome, expired)] = route
        return route


_PLAIN_COLUMNS = [
    "message_id", "conversation_id", "sequence_number", "message_type", "body", "encoding", "sender",
    "headers", "abort_count", "move_count", "batch_id",
]
