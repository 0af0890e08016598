"""The events the declared alert hook (`alert_hook: module:function`) receives: a queue disabled, a
cycle that failed messages (poisoned, dead-lettered or quarantined them), a queue an outage had
disabled that a probe resumed, or an interrupted action left for the operator."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

MESSAGES_FAILED = "messages_failed"
# A queue an outage disabled, resumed by a probe that succeeded (`outage_recovery: probe`).
QUEUE_RECOVERED = "queue_recovered"
# An interrupted operator action whose completion cannot go on, left `planned` for the operator
# (operations/interrupted.py) while the queue goes on: once per action and reason.
ACTION_LEFT = "action_left"

# How each failure table's arrivals are told: "poisoned 3".
_VERBS = {"poison": "poisoned", "dead_letter": "dead-lettered", "quarantine": "quarantined"}


@dataclass(frozen=True)
class FailureCount:
    """How many messages one cycle sent to one failure table in one failure group."""

    table: str  # poison, dead_letter or quarantine
    group: str  # the group id, as `poison-pipeline groups` lists it and `redrive --group` takes it
    count: int
    error: str  # the error type, or `no error: <reason>` for a group without an error
    example_id: str | None = None


def _fields_of(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def failures_to_json(failures: tuple[FailureCount, ...]) -> str:
    return json.dumps([_fields_of(f) for f in failures])


def failures_from_json(text: str | None) -> tuple[FailureCount, ...]:
    return tuple(FailureCount(**item) for item in json.loads(text)) if text else ()


def merged_failures(failures: list[FailureCount]) -> tuple[FailureCount, ...]:
    """The counts of several cycles as one per table and group (the first one's error and example),
    biggest first."""
    merged: dict[tuple[str, str], FailureCount] = {}
    for failure in failures:
        key = (failure.table, failure.group)
        known = merged.get(key)
        merged[key] = failure if known is None else FailureCount(
            known.table, known.group, known.count + failure.count, known.error, known.example_id)
    return tuple(sorted(merged.values(), key=lambda failure: -failure.count))


def summarise_failures(table: str, seq: int, failures: tuple[FailureCount, ...]) -> str:
    """One line: `inbound cycle 7 poisoned 3 and dead-lettered 1 message(s) in 2 failure group(s)`."""
    per_table: dict[str, int] = {}
    for failure in failures:
        per_table[failure.table] = per_table.get(failure.table, 0) + failure.count
    told = " and ".join(f"{_VERBS.get(t, t)} {n}" for t, n in per_table.items())
    groups = len({f.group for f in failures})
    return f"{table} cycle {seq} {told} message(s) in {groups} failure group(s)"


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
    # messages_failed only: the cycle (its Dagster run id, "manual" outside Dagster, and its seq in
    # the table's cycle journal) and what it failed, per table and group, biggest first.
    run_id: str | None = None
    cycle_seq: int | None = None
    failures: tuple[FailureCount, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (`at` in ISO 8601), for hooks that post to mail or chat."""
        # Shallow: every field is a str, int, None or datetime (asdict's deep copies cost a sensor
        # raising a thousand events most of its evaluation).
        data = _fields_of(self)
        data["at"] = self.at.isoformat()
        data["failures"] = [_fields_of(f) for f in self.failures]
        return data

    def describe(self) -> str:
        """One line a person can act on: which queue, what happened, who, when, and where."""
        if self.kind == MESSAGES_FAILED:
            groups = ", ".join(f"{f.group} ({f.table}, {f.count}, {f.error})" for f in self.failures)
            return (f"queue {self.queue!r}: {self.reason}: {groups} (run {self.run_id} at "
                    f"{self.at.isoformat()}; event {self.event_id})")
        if self.kind == ACTION_LEFT:
            return (f"queue {self.queue!r}: {self.reason} (at {self.at.isoformat()}; event {self.event_id})")
        if self.kind == QUEUE_RECOVERED:
            return (f"queue {self.queue!r} resumed: {self.reason} (by {self.actor or 'unknown'} at "
                    f"{self.at.isoformat()}; event {self.event_id})")
        where = f", message {self.message_id}" if self.message_id else ""
        where += f" in {self.queue}/{self.table}" if self.table else ""
        return (f"queue {self.queue!r} is disabled: {self.reason or 'no reason given'} "
                f"(by {self.actor or 'unknown'} at {self.at.isoformat()}{where}; event {self.event_id})")
