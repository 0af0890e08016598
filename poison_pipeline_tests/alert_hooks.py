"""Alert hooks the tests declare: one records every event it is called with, one always fails."""

from __future__ import annotations

import time

from poison_pipeline.domain.alerts import QueueEvent

CALLS: list[QueueEvent] = []


class ChatDown(Exception):  # noqa: N818
    pass


def record(event: QueueEvent) -> None:
    CALLS.append(event)


def broken(event: QueueEvent) -> None:
    raise ChatDown(f"chat webhook answered 503 for {event.event_id}")


def slow(event: QueueEvent) -> None:
    time.sleep(30)
    CALLS.append(event)
