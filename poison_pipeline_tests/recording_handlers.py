"""Handlers that record what they saw in files, for the ordering, outage and batch-handler tests.

They run in Spark's Python workers, so nothing they do can reach the test's memory: each call
appends one JSON line to the file named by the message body's `log` key (one `os.write` of an
`O_APPEND` descriptor, so lines of concurrent workers never interleave).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from poison_pipeline.domain.envelope import Message
from poison_pipeline.handlers import batch_handler
from poison_pipeline_tests.handlers import Unfixable


class DependencyDown(ConnectionError):
    """What a handler raises while the database it writes to is unreachable."""


def append_line(path: str, record: dict[str, Any]) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (json.dumps(record) + "\n").encode())
    finally:
        os.close(descriptor)


def read_lines(path: os.PathLike[str] | str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def _partition() -> int | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else None


def recording(message: Message) -> None:
    """Logs every attempt, then behaves as the body says: `hold_while` PATH (wait while that file
    exists), `fail` (always raise), `fail_until_cycle` N, `unfixable`, `down_if` PATH (raise
    DependencyDown while that file exists)."""
    body = message.json()
    if body.get("log"):
        append_line(body["log"], {
            "id": message.message_id, "conversation": message.conversation_id, "seq": message.sequence_number,
            "cycle": message.cycle, "attempt": message.attempt, "redrive_count": message.redrive_count,
            "total_abort_count": message.total_abort_count, "abort_count": message.abort_count,
            "move_count": message.move_count, "partition": _partition(), "pid": os.getpid(),
        })
    while body.get("hold_while") and os.path.exists(body["hold_while"]):
        time.sleep(0.05)
    if body.get("down_if") and os.path.exists(body["down_if"]):
        raise DependencyDown("inventory database down")
    if body.get("unfixable"):
        raise Unfixable("cannot ever work")
    if body.get("fail"):
        raise ValueError(f"message {message.message_id} always fails")
    if message.cycle < body.get("fail_until_cycle", 0):
        raise LookupError("profile does not exist yet")


@batch_handler(max_messages=8)
def recording_batch(messages: list[Message]) -> None:
    """Logs every call (the ids it got, and whether it succeeds); the call fails when any message
    of it has `poison` in its body."""
    bodies = [m.json() for m in messages]
    poisoned = any(b.get("poison") for b in bodies)
    log = next((b["log"] for b in bodies if b.get("log")), None)
    if log:
        append_line(log, {"ids": [m.message_id for m in messages], "ok": not poisoned,
                          "attempts": [m.attempt for m in messages]})
    if poisoned:
        raise ValueError("a poison message in the batch: " + ", ".join(
            m.message_id for m, b in zip(messages, bodies, strict=True) if b.get("poison")))
