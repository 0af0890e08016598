"""The output of a cycle's Arrow batch: its input with only the columns the cycle changes replaced."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.envelope import Outgoing
from poison_pipeline.domain.errors import ErrorInfo
from poison_pipeline.domain.routing import OUTAGE, POISON, PROCESSED, STAY, Route
from poison_pipeline.engine.delivery import AttemptRecord, Delivery
from poison_pipeline.storage import schemas

_ERROR_COLUMNS = {
    "last_error_type": "type",
    "last_error_message": "message",
    "last_error_stack": "stack",
    "last_error_signature": "signature",
}
# The processed ledger keeps only ids and counts: blanking the other columns (bodies above all) for
# the bulk of the messages keeps the staged data small.
_LEDGER_COLUMNS = frozenset(schemas.PROCESSED.names) | {"destination", "disposition", "reason", "attempts", "sent"}


class Changes:
    """What a cycle does to each message of one Arrow batch, gathered row by row in input order."""

    def __init__(self, waiting: frozenset[str], now: datetime, delay: timedelta) -> None:
        self.waiting = waiting
        self.now = now
        self.delay = delay
        self.routes: list[Route] = []
        self.failures: list[int] = []
        self.errors: list[ErrorInfo | None] = []
        self.due: list[datetime | None] = []
        self.offsets: list[int] = [0]
        self.attempts: list[AttemptRecord] = []
        self.sent_offsets: list[int] = [0]
        self.sent: list[Outgoing] = []

    def add(self, route: Route, delivery: Delivery | None = None, due: datetime | None = None) -> int:
        """Record a message's route (and its delivery, if it was attempted); returns its index."""
        self.routes.append(route)
        if delivery is None:
            self.failures.append(0)
            self.errors.append(None)
        else:
            self.failures.append(delivery.failures)
            self.errors.append(delivery.last_error)
            self.attempts.extend(delivery.attempts)
            self.sent.extend(delivery.sent)
        self.offsets.append(len(self.attempts))
        self.sent_offsets.append(len(self.sent))
        self.due.append(due or self._due(route.destination))
        return len(self.routes) - 1

    def _due(self, destination: str) -> datetime | None:
        if destination in (STAY, POISON):
            return self.now
        if destination.startswith("retry_"):
            return self.now + self.delay
        return None

    def uncharge(self, index: int) -> None:
        """Return a message where it was with its counts untouched; its attempts stay on record,
        marked as made during an outage."""
        self.routes[index] = OUTAGE
        self.failures[index] = 0
        assert self.sent_offsets[index] == self.sent_offsets[index + 1], "an uncharged message sent nothing"
        self.due[index] = self.now
        for k in range(self.offsets[index], self.offsets[index + 1]):
            record = self.attempts[k]
            if record.outcome != "success":
                self.attempts[k] = record._replace(outcome="outage")

    def apply(self, batch: pa.RecordBatch, out_batch: str) -> pa.RecordBatch:
        destinations = [r.destination for r in self.routes]
        # A move between queues: MSMQ counts it and starts the abort count afresh.
        moved = pa.array([d in self.waiting for d in destinations])
        processed = pa.array([d == PROCESSED for d in destinations])
        failures = pa.array(self.failures, pa.int32())
        columns = {
            "abort_count": pc.if_else(moved, 0, pc.add(batch.column("abort_count"), failures)),
            "total_abort_count": pc.add(batch.column("total_abort_count"), failures),
            "move_count": pc.add(batch.column("move_count"), pc.cast(moved, pa.int32())),
            "entered_at": pc.if_else(moved, pa.scalar(self.now, schemas.TS), batch.column("entered_at")),
            "due_at": pc.coalesce(pa.array(self.due, schemas.TS), batch.column("due_at")),
            "batch_id": pc.if_else(processed, batch.column("batch_id"), pa.scalar(out_batch)),
        }
        for name, attribute in _ERROR_COLUMNS.items():
            new = pa.array([getattr(e, attribute) if e is not None else None for e in self.errors], pa.string())
            columns[name] = pc.coalesce(new, batch.column(name))
        columns["destination"] = pa.array(destinations, pa.string())
        columns["disposition"] = pa.array([r.disposition.value for r in self.routes], pa.string())
        columns["reason"] = pa.array([r.reason for r in self.routes], pa.string())
        columns["attempts"] = self._attempts()
        columns["sent"] = self._sent()
        arrays = []
        for f in schemas.RESULT:
            array = columns[f.name] if f.name in columns else batch.column(f.name)
            if f.name not in _LEDGER_COLUMNS:
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

    def _sent(self) -> pa.Array:
        sent = self.sent
        fields = [
            pa.array([getattr(o, f.name) if f.name != "headers" else list(o.headers.items()) for o in sent], f.type)
            for f in schemas.SENT_FIELDS
        ]
        values = pa.StructArray.from_arrays(fields, fields=schemas.SENT_FIELDS)
        return pa.ListArray.from_arrays(pa.array(self.sent_offsets, pa.int32()), values)
