"""The event a queue-disabled alert hands to the declared alert hook (`alert_hook: module:function`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime


@dataclass(frozen=True)
class QueueEvent:
    """One row of a queue's events table, named by its queue, as the alert hook receives it."""

    queue: str
    event_id: str
    kind: str
    at: datetime
    actor: str | None
    reason: str | None
    message_id: str | None = None
    table: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        """JSON-ready (`at` in ISO 8601), for hooks that post to mail or chat."""
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data

    def describe(self) -> str:
        """One line a person can act on: which queue, why, who, when, and which message."""
        where = f", message {self.message_id}" if self.message_id else ""
        where += f" in {self.queue}/{self.table}" if self.table else ""
        return (f"queue {self.queue!r} is disabled: {self.reason or 'no reason given'} "
                f"(by {self.actor or 'unknown'} at {self.at.isoformat()}{where}; event {self.event_id})")
