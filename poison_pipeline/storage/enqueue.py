"""Validating envelopes and appending them to a queue's inbound table as one batch."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.envelope import Envelope, EnvelopeError, parse_envelope
from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.storage import schemas
from poison_pipeline.storage.intake import ENQUEUE, ensure_intake, record_intake
from poison_pipeline.storage.tables import QueueTables


@dataclass(frozen=True)
class Refusal:
    line: int
    message_id: str | None
    error: str
    record: str


@dataclass
class EnqueueResult:
    accepted: int = 0
    batch_id: str | None = None
    refused: list[Refusal] = field(default_factory=list)


def message_rows(envelopes: Iterable[Envelope], batch_id: str, now: datetime) -> pa.Table:
    """Envelopes as rows of a waiting table: fresh counts, due now."""
    rows = [
        {
            **{name: getattr(env, name) for name in schemas.MESSAGE.names if hasattr(env, name)},
            "headers": list(env.headers.items()),
            "abort_count": 0,
            "total_abort_count": 0,
            "move_count": 0,
            "redrive_count": 0,
            "due_at": now,
            "entered_at": now,
            "batch_id": batch_id,
        }
        for env in envelopes
    ]
    return pa.Table.from_pylist(rows, schema=schemas.MESSAGE)


def enqueue(
    declaration: Declaration,
    queue: str,
    records: Iterable[Any],
    now: datetime | None = None,
) -> EnqueueResult:
    """Validate each record and append the valid ones to `queue`'s inbound table in one commit.

    A refused record is reported with its position and the reason; it never blocks the others.
    """
    policy = declaration.queue(queue).policy
    now = now or datetime.now(UTC)
    result = EnqueueResult()
    accepted: list[Envelope] = []
    seen: set[str] = set()
    for line, record in enumerate(records, start=1):
        raw = record if isinstance(record, str) else json.dumps(record, default=str)
        try:
            if isinstance(record, str):
                try:
                    record = json.loads(record)
                except json.JSONDecodeError as error:
                    raise EnvelopeError(f"not valid JSON ({error})") from None
            envelope = parse_envelope(record, now, policy.time_to_live, policy.max_body_bytes)
            if envelope.message_id in seen:
                raise EnvelopeError(f"message_id: {envelope.message_id!r} appears twice in this batch")
            # Lone surrogates pass json.loads but cannot be stored as UTF-8: refuse them here.
            json.dumps(record, ensure_ascii=False, default=str).encode("utf-8")
        except (EnvelopeError, UnicodeError, OverflowError, RecursionError) as error:
            message_id = record.get("message_id") if isinstance(record, dict) else None
            result.refused.append(Refusal(line, message_id, str(error), raw[:1000]))
            continue
        seen.add(envelope.message_id)
        accepted.append(envelope)
    if accepted:
        tables = QueueTables.of(declaration, queue)
        tables.ensure()
        ensure_intake(tables, now)
        result.batch_id = f"enq-{uuid.uuid4().hex}"
        tables.append(INBOUND, message_rows(accepted, result.batch_id, now))
        # A process killed between the two commits leaves the batch uncounted: the conservation
        # check then shows more accounted than accepted, by this batch's size.
        record_intake(tables, ENQUEUE, result.batch_id, len(accepted), now)
        result.accepted = len(accepted)
    return result
