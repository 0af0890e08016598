"""The latency benchmark's handler: the example inventory handler's work, then the moment the
message was handled, appended to $LATENCY_LOG as `<message id> <unix time>` (one write per message
on a descriptor kept open per process; lines of concurrent processes never interleave).

A module of its own because the runs' processes and Spark's Python workers import it by name: the
benchmark puts this folder on their PYTHONPATH.
"""

from __future__ import annotations

import os
import time

from poison_pipeline.domain.envelope import Message
from poison_pipeline.examples import handlers

HANDLER = "latency_handler:withdraw"
LOG_ENV = "LATENCY_LOG"
_descriptor: dict[int, int] = {}  # by pid: a forked process opens its own


def withdraw(message: Message) -> None:
    handlers.withdraw_inventory(message)
    pid = os.getpid()
    if pid not in _descriptor:
        _descriptor[pid] = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_descriptor[pid], f"{message.message_id} {time.time()}\n".encode())
