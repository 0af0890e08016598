"""A handler that fails in every way a handler can (issue 11), keeping a side-effect log.

The body names the kind (`{"kind": "segfault", "log": "/tmp/.../effects.jsonl"}`). Every delivery
appends a `start` line to the log before it does anything, and a `done` line when it returns, so a
test sees how often each message was delivered and whether the delivery went through, whatever
process (a small cycle's worker, a Spark executor) ran it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from poison_pipeline.domain.envelope import Message

HANDLER = "poison_pipeline_tests.failure_handlers:misbehave"
# What the stdout flood writes: 2 GiB in 64 MiB writes.
FLOOD_CHUNK = 64 << 20
FLOOD_BYTES = 2 << 30


def _log(message: Message, log: str, event: str, **extra: Any) -> None:
    line = json.dumps({"id": message.message_id, "attempt": message.attempt, "cycle": message.cycle,
                       "pid": os.getpid(), "event": event, **extra}) + "\n"
    # One append per line: lines from several processes never interleave.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _recurse(depth: int) -> int:
    return _recurse(depth + 1) + 1


def _deadlock_in_c() -> None:
    """Lock a pthread mutex twice through a ctypes.PyDLL call: the thread waits forever inside libc,
    holding the GIL, so no signal handler (the handler_timeout's alarm) ever runs."""
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


def _swallow_timeouts() -> None:
    """A hang in Python that catches whatever interrupts it, the timeout included."""
    while True:
        with contextlib.suppress(BaseException):
            time.sleep(3600)


def _flood_stdout() -> None:
    chunk = "x" * FLOOD_CHUNK
    for _ in range(FLOOD_BYTES // FLOOD_CHUNK):
        sys.stdout.write(chunk)
    sys.stdout.flush()


async def _never_awaited() -> None:
    raise AssertionError("an async handler's body never runs unless it is awaited")


def _leak_thread() -> None:
    """A non-daemon thread that outlives the attempt (and its worker's whole task)."""
    threading.Thread(target=time.sleep, args=(3600,), name="leaked-by-handler", daemon=False).start()


def _mutate(message: Message, log: str) -> None:
    """Change everything of the message a handler can reach, then fail, so that the next attempt
    (and the row stored where the message ends) shows whether the change leaked."""
    _log(message, log, "saw", headers=dict(message.headers), body=message.text())
    message.headers["tampered"] = "yes"
    message.headers.pop("origin", None)
    object.__setattr__(message.envelope, "body", b'{"tampered": true}')
    object.__setattr__(message.envelope, "message_type", "tampered")
    raise ValueError("failing after mutating the message")


class Unprintable(Exception):  # noqa: N818 - named for what it is
    """An exception whose message cannot even be read: str() of it fails."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


def _raise(kind: type[BaseException], *args: Any) -> Callable[[], None]:
    def run() -> None:
        raise kind(*args)

    return run


KINDS: dict[str, Callable[[], Any]] = {
    "ok": lambda: None,
    "exception": _raise(ValueError, "an ordinary exception"),
    "unprintable_exception": _raise(Unprintable),
    "system_exit": lambda: sys.exit(3),
    "keyboard_interrupt": _raise(KeyboardInterrupt),
    "generator_exit": _raise(GeneratorExit),
    "memory_error": lambda: bytearray(1 << 62),  # a real allocation that fails
    "recursion_error": lambda: _recurse(0),
    "segfault": lambda: ctypes.string_at(0),
    "os_exit": lambda: os._exit(3),
    "python_hang": lambda: time.sleep(3600),
    "swallowed_hang": _swallow_timeouts,
    "c_hang": _deadlock_in_c,
    "returns_value": lambda: {"ignored": True},
    "returns_false": lambda: False,
    "returns_coroutine": _never_awaited,
    "stdout_flood": _flood_stdout,
    "leaked_thread": _leak_thread,
}


def misbehave(message: Message) -> Any:
    body = message.json()
    kind, log = body["kind"], body["log"]
    _log(message, log, "start", kind=kind)
    result = _mutate(message, log) if kind == "mutate" else KINDS[kind]()
    _log(message, log, "done", kind=kind)
    return result
