"""The per-message work of a cycle, as an Arrow-batch function that Spark runs on its executors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from poison_pipeline.domain.envelope import Envelope, Message
from poison_pipeline.domain.errors import Classifier
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
from poison_pipeline.engine.delivery import Delivery, deliver
from poison_pipeline.storage import schemas

_ENVELOPE_NAMES = [f.name for f in schemas.ENVELOPE_FIELDS]


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


def _envelope(row: dict[str, Any]) -> Envelope:
    values = {name: row[name] for name in _ENVELOPE_NAMES}
    values["headers"] = dict(row["headers"] or [])
    values["body"] = row["body"] or b""
    return Envelope(**values)


class Processor:
    """Decides the route of every message of a partition; instances live on the executors."""

    def __init__(self, spec: CycleSpec) -> None:
        self.spec = spec
        self.handler = import_callable(spec.handler) if spec.handler else None
        self.classifier = Classifier(spec.policy.unrecoverable)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [self.process(row) for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(rows, schema=schemas.RESULT)

    def _route(self, row: dict[str, Any], expired: bool) -> tuple[Route, Delivery | None]:
        spec = self.spec
        duplicate = row["message_id"] in spec.seen or (row["message_id"], row["batch_id"]) in spec.losers
        early = route_before_delivery(expired, duplicate)
        if early is not None:
            return early, None
        if self.handler is None:  # the poison queue's default reader: quarantine
            return route_poison(Outcome.EXHAUSTED, spec.poison, expired), None
        envelope = _envelope(row)
        delivery = deliver(
            self.handler,
            lambda attempt: Message(
                envelope=envelope,
                queue=spec.queue,
                abort_count=row["abort_count"] + attempt - 1,
                move_count=row["move_count"],
                cycle=spec.cycle,
                attempt=attempt,
            ),
            spec.attempts_per_cycle,
            spec.timeout_seconds,
            self.classifier,
        )
        if spec.is_poison:
            return route_poison(delivery.outcome, spec.poison, expired), delivery
        return route_main(spec.table, delivery.outcome, spec.policy, expired), delivery

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        spec = self.spec
        expired = row["expires_at"] is not None and row["expires_at"] <= spec.now
        route, delivery = self._route(row, expired)
        out = dict(row)
        if delivery is not None:
            out["abort_count"] = row["abort_count"] + delivery.failures
            out["total_abort_count"] = row["total_abort_count"] + delivery.failures
            error = delivery.last_error
            if error is not None:
                out["last_error_type"] = error.type
                out["last_error_message"] = error.message
                out["last_error_stack"] = error.stack
                out["last_error_signature"] = error.signature
        if route.destination.startswith("retry_") or route.destination == POISON:
            # A move between queues: MSMQ counts it and starts the abort count afresh.
            out["move_count"] = row["move_count"] + 1
            out["abort_count"] = 0
            out["entered_at"] = spec.now
            delay = spec.policy.retry_cycle_delay if route.destination != POISON else timedelta(0)
            out["due_at"] = spec.now + delay
        if route.destination != PROCESSED:
            out["batch_id"] = spec.out_batch
        if route.destination == STAY:
            out["due_at"] = spec.now
        if route.destination == PROCESSED:
            out["body"] = None  # the ledger keeps no bodies
        out["headers"] = row["headers"] or []
        out["destination"] = route.destination
        out["disposition"] = route.disposition.value
        out["reason"] = route.reason
        out["attempts"] = [a.as_row() for a in delivery.attempts] if delivery else []
        return out
