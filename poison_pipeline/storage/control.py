"""Whether a queue is enabled, kept as events in the queue's events table (who, when, why)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import EVENTS, QueueTables

QUEUE_DISABLED = "queue_disabled"
QUEUE_ENABLED = "queue_enabled"


@dataclass(frozen=True)
class QueueState:
    enabled: bool
    reason: str | None = None
    since: datetime | None = None
    actor: str | None = None


def event_row(kind: str, at: datetime, actor: str, reason: str, message_id: str | None = None,
              table: str | None = None) -> dict[str, object]:
    return {
        "event_id": f"evt-{uuid.uuid4().hex}",
        "kind": kind,
        "at": at,
        "actor": actor,
        "reason": reason,
        "message_id": message_id,
        "table": table,
    }


def queue_state(tables: QueueTables) -> QueueState:
    if not tables.exists(EVENTS):
        return QueueState(enabled=True)
    events = tables.open(EVENTS).to_pyarrow_table(columns=["kind", "at", "actor", "reason"])
    toggles = events.filter(pc.is_in(events["kind"], pa.array([QUEUE_DISABLED, QUEUE_ENABLED])))
    if toggles.num_rows == 0:
        return QueueState(enabled=True)
    last = toggles.sort_by([("at", "descending")]).slice(0, 1).to_pylist()[0]
    return QueueState(last["kind"] == QUEUE_ENABLED, last["reason"], last["at"], last["actor"])


def set_enabled(tables: QueueTables, enabled: bool, actor: str, reason: str) -> bool:
    """Record an enable or disable; returns False (and writes nothing) when already in that state."""
    tables.ensure()
    if queue_state(tables).enabled == enabled:
        return False
    kind = QUEUE_ENABLED if enabled else QUEUE_DISABLED
    row = event_row(kind, datetime.now(UTC), actor, reason)
    tables.append(EVENTS, pa.Table.from_pylist([row], schema=schemas.EVENTS))
    return True
