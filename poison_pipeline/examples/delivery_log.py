"""The example handlers, each recording what it delivered in the application database.

`make soak` (benchmarks/soak.py) declares these instead of `examples.handlers`' so that it can check
from the application's side that no message was delivered twice: every call that returns appends
one JSON line per message to `<app db>/deliveries.log`, with when and in which process it was
delivered (pid, start time and ancestors' pids, which lead to the Dagster run's process). A delivery made by a run that
was then killed before its cycle committed is delivered again by the cycle that recovers it (the
README: receivers are idempotent by id); the soak knows which runs it killed and which failed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from poison_pipeline.domain.envelope import Message
from poison_pipeline.examples import handlers
from poison_pipeline.handlers import batch_handler, batch_size
from poison_pipeline.proc import process_start, stat_fields

LOG = "deliveries.log"


def log_path() -> Path:
    return handlers.app_db() / LOG


def ancestors(pid: int | str = "self", depth: int = 8) -> list[int]:
    """The pids of the process's parent, its parent's parent, ... (up to `depth`, init excluded): a
    delivery made in a small cycle's worker or a Spark Python worker is found under its run's process."""
    found: list[int] = []
    fields = stat_fields(pid)
    while fields and len(found) < depth and int(fields[1]) > 1:
        found.append(int(fields[1]))
        fields = stat_fields(found[-1])
    return found


def _record(handler: str, messages: list[Message]) -> None:
    pid, start, at, parents = os.getpid(), process_start(), time.time(), ancestors()
    lines = "".join(json.dumps({"handler": handler, "id": m.message_id, "cycle": m.cycle, "attempt": m.attempt,
                                "at": at, "pid": pid, "start": start, "ancestors": parents}) + "\n"
                    for m in messages)
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of an O_APPEND descriptor: lines of concurrent workers never interleave.
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, lines.encode())
    finally:
        os.close(descriptor)


def _recorded(handler: Callable[[Message], None]) -> Callable[[Message], None]:
    def deliver(message: Message) -> None:
        handler(message)
        _record(handler.__name__, [message])

    deliver.__name__ = handler.__name__
    return deliver


def _recorded_batch(handler: Callable[[list[Message]], None]) -> Callable[[list[Message]], None]:
    size = batch_size(handler)
    assert size is not None, f"{handler.__name__} is not a batch handler"

    @batch_handler(max_messages=size)
    def deliver(messages: list[Message]) -> None:
        handler(messages)
        _record(handler.__name__, messages)

    deliver.__name__ = handler.__name__
    return deliver


withdraw_inventory = _recorded(handlers.withdraw_inventory)
place_order = _recorded(handlers.place_order)
account_event = _recorded(handlers.account_event)
show_slide = _recorded(handlers.show_slide)
checkout = _recorded(handlers.checkout)
ship_batch = _recorded_batch(handlers.ship_batch)


def read_deliveries(app_db: Path) -> list[dict[str, Any]]:
    """Every recorded delivery, in the order they were written."""
    path = app_db / LOG
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
