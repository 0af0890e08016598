"""The output of a cycle's Arrow batch: its input with only the columns the cycle changes replaced."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.envelope import Outgoing
from poison_pipeline.domain.errors import ErrorInfo
from poison_pipeline.domain.routing import (
    OUTAGE,
    POISON,
    PROCESSED,
    PROCESSED_ROUTE,
    STAY,
    Route,
    entering_move_count,
    moves_back,
)
from poison_pipeline.engine.delivery import SUCCESS, Delivery
from poison_pipeline.storage import schemas

_ERROR_COLUMNS = {
    "last_error_type": "type",
    "last_error_message": "message",
    "last_error_stack": "stack",
    "last_error_signature": "signature",
}


class Changes:
    """What a cycle does to each message of one Arrow batch, set per row (in any order: a batch
    handler's group is settled after the early routes of rows that come after it)."""

    def __init__(self, rows: int, table: str, waiting: frozenset[str], now: datetime) -> None:
        self.table = table
        self.waiting = pa.array(sorted(waiting), pa.string())
        # The retry subqueues among them, and the move count a message entering each has.
        retries = sorted(t for t in waiting if entering_move_count(t) is not None)
        self.retries = pa.array(retries, pa.string())
        self.entering = pa.array([entering_move_count(t) for t in retries], pa.int32())
        self.now = now
        # Each row's route as an index into `kinds`, the batch's few distinct routes (-1: none yet).
        self.kinds: list[Route] = [PROCESSED_ROUTE]
        self._kind: dict[int, int] = {id(PROCESSED_ROUTE): 0}
        self.routes = [-1] * rows
        self.due: list[datetime | None] = [None] * rows
        # What deliveries did, as columns: a row's failures, last error and sends, and every attempt
        # of the batch in one flat log, a list per field with its row beside it. Nothing per message
        # outlives its delivery, and what few messages have (errors, sends, failed attempts) is kept
        # by row or by log position: most messages succeed at once and would fill those with None.
        self.failures = [0] * rows
        self.errors: dict[int, ErrorInfo] = {}
        self.sent: dict[int, list[Outgoing]] = {}
        self.log_rows: list[int] = []
        self.log_numbers: list[int] = []
        self.log_started: list[int] = []
        self.log_durations: list[float] = []
        # The outcome and error of each attempt that did not succeed, by its position in the log.
        self.log_failed: dict[int, tuple[str, ErrorInfo | None]] = {}
        self.uncharged: set[int] = set()

    def set(self, index: int, route: Route, delivery: Delivery | None = None, due: datetime | None = None) -> None:
        """Record a message's route (and its delivery, if it was attempted)."""
        kind = self._kind.get(id(route))
        if kind is None:
            kind = self._kind[id(route)] = len(self.kinds)
            self.kinds.append(route)
        self.routes[index] = kind
        if due is not None or route.destination != PROCESSED:
            self.due[index] = due or self._due(route.destination)
        if delivery is not None:
            for number, started, duration, outcome, error in delivery.attempts:
                if outcome != SUCCESS:
                    self.log_failed[len(self.log_rows)] = (outcome, error)
                self._logged(index, number, started, duration)
            if delivery.failures:
                self.failures[index] = delivery.failures
                if delivery.last_error is not None:
                    self.errors[index] = delivery.last_error
            if delivery.sent:
                self.sent[index] = delivery.sent

    def _logged(self, index: int, number: int, started: int, duration: float) -> None:
        self.log_rows.append(index)
        self.log_numbers.append(number)
        self.log_started.append(started)
        self.log_durations.append(duration)

    def succeeded(self, index: int, started: int, duration: float, sent: list[Outgoing]) -> None:
        """`set` for a message processed at its first attempt (most are), the short way."""
        self.routes[index] = 0
        self._logged(index, 1, started, duration)
        if sent:
            self.sent[index] = sent

    def _due(self, destination: str) -> datetime | None:
        if destination in (STAY, POISON):
            return self.now
        # Each message's delay to its next retry cycle is its own (policy backoff, rules, jitter).
        assert not destination.startswith("retry_"), "a move to a retry subqueue comes with its due time"
        return None

    def uncharge(self, index: int) -> None:
        """Return a message where it was with its counts untouched; its failed attempts stay on
        record, marked as made during an outage."""
        assert index not in self.sent, "an uncharged message sent nothing"
        self.set(index, OUTAGE)
        self.due[index] = self.now
        self.failures[index] = 0
        self.uncharged.add(index)

    def apply(self, batch: pa.RecordBatch, out_batch: str) -> pa.RecordBatch:
        # A batch has a handful of distinct routes: each row names one by its index, and the text
        # columns are taken from those few (attribute and enum reads per row cost more than the rest).
        kinds = self.kinds
        which = pa.array(self.routes, pa.int32())
        assert -1 not in self.routes, "every message of the batch has a route"

        def per_row(values: list[str | None]) -> pa.Array:
            return pc.take(pa.array(values, pa.string()), which)

        destinations = per_row([r.destination for r in kinds])
        # A move between queues: MSMQ counts it and starts the abort count afresh.
        moved = pc.is_in(destinations, value_set=self.waiting)
        processed = pc.equal(destinations, PROCESSED)
        failures = pa.array(self.failures, pa.int32())
        columns = {
            "abort_count": pc.if_else(moved, 0, pc.add(batch.column("abort_count"), failures)),
            "total_abort_count": pc.add(batch.column("total_abort_count"), failures),
            "move_count": self._move_counts(batch.column("move_count"), destinations, moved),
            "entered_at": pc.if_else(moved, pa.scalar(self.now, schemas.TS), batch.column("entered_at")),
            "due_at": pc.coalesce(pa.array(self.due, schemas.TS), batch.column("due_at")),
            "batch_id": pc.if_else(processed, batch.column("batch_id"), pa.scalar(out_batch)),
        }
        for name, attribute in _ERROR_COLUMNS.items():
            errors = {i: getattr(e, attribute) for i, e in self.errors.items()}
            columns[name] = _sparse(errors, batch.num_rows, batch.column(name))
        columns["destination"] = destinations
        columns["disposition"] = per_row([r.disposition.value for r in kinds])
        columns["reason"] = per_row([r.reason for r in kinds])
        columns["attempts"] = self._attempts(batch.num_rows)
        sent = self.sent
        columns["sent"] = (pa.array([encode_sent(sent[i]) if i in sent else None for i in range(batch.num_rows)],
                                    pa.binary()) if sent else pa.nulls(batch.num_rows, pa.binary()))
        arrays = [columns[f.name] if f.name in columns else batch.column(f.name) for f in schemas.RESULT]
        return pa.RecordBatch.from_arrays(arrays, schema=schemas.RESULT)

    def _move_counts(self, stored: pa.Array, destinations: pa.Array, moved: pa.Array) -> pa.Array:
        """Each message's move count after the cycle, as MSMQ counts it (SPEC section 3)."""
        # Taken from a retry subqueue, a message came back to the application queue (its handler
        # read that count), unless it stays there: then it never left, and its next cycle counts it.
        back = pc.if_else(pc.equal(destinations, STAY), stored,
                          pc.add(stored, pa.scalar(moves_back(self.table), pa.int32())))
        counted = pc.add(back, pc.cast(moved, pa.int32()))
        # A message joining its conversation in a later retry subqueue skips the cycles between:
        # it takes the count every message there has, so its handler too reads 2k in cycle k.
        entering = pc.take(self.entering, pc.index_in(destinations, value_set=self.retries))
        return pc.coalesce(entering, counted)

    def _attempts(self, rows: int) -> pa.Array:
        """Each row's attempts, in the order made, as the staged list column."""
        made = np.asarray(self.log_rows, dtype=np.int64)
        # Rows are settled in order: a batch handler's group comes after early routes of later rows,
        # but those made no attempts, so the log is in row order.
        assert not np.any(made[1:] < made[:-1]), "attempts are logged in row order"
        offsets = np.concatenate(([0], np.cumsum(np.bincount(made, minlength=rows)))).astype(np.int32)
        failed = self.log_failed
        outcomes = _sparse({k: outcome for k, (outcome, _) in failed.items()}, len(made),
                           pa.repeat(pa.scalar(SUCCESS), len(made)))
        if self.uncharged:
            # An uncharged message's failed attempts were made during an outage.
            mine = pc.is_in(pa.array(made), value_set=pa.array(sorted(self.uncharged), pa.int64()))
            outcomes = pc.if_else(pc.and_(mine, pc.not_equal(outcomes, SUCCESS)), "outage", outcomes)
        fields = [
            pa.array(self.log_numbers, pa.int32()),
            pa.array(self.log_started, pa.int64()).cast(schemas.TS),
            pa.array(self.log_durations, pa.float64()),
            outcomes,
            *(_sparse({k: getattr(e, attribute) for k, (_, e) in failed.items() if e is not None}, len(made))
              for attribute in (*_ERROR_COLUMNS.values(), "code")),
        ]
        values = pa.StructArray.from_arrays(fields, fields=schemas.ATTEMPT_FIELDS)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _sparse(values: dict[int, str | None], length: int, otherwise: pa.Array | None = None) -> pa.Array:
    """A string column of `length` with `values` at their positions (most positions have none) and,
    elsewhere or where a value is None, `otherwise` (or null)."""
    if not values:
        return otherwise if otherwise is not None else pa.nulls(length, pa.string())
    picks = np.zeros(length, dtype=np.int32)
    picks[np.fromiter(values, dtype=np.int64, count=len(values))] = np.arange(1, len(values) + 1, dtype=np.int32)
    given = pc.take(pa.array([None, *values.values()], pa.string()), pa.array(picks))
    return given if otherwise is None else pc.coalesce(given, otherwise)


def encode_sent(sent: list[Outgoing]) -> bytes:
    return json.dumps([{**asdict(o), "body": base64.b64encode(o.body).decode()} for o in sent]).encode()


def decode_sent(data: bytes) -> list[dict[str, Any]]:
    return [{**o, "body": base64.b64decode(o["body"])} for o in json.loads(data)]
