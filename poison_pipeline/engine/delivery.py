"""Delivering one message to its handler, attempt after attempt, on an executor.

Each attempt is isolated: whatever the handler raises (or a timeout) aborts that attempt only.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from poison_pipeline.domain.envelope import Message, Outgoing
from poison_pipeline.domain.errors import Classifier, ErrorInfo, HandlerTimeout
from poison_pipeline.domain.routing import Outcome

Handler = Callable[[Message], Any]


class AttemptRecord(NamedTuple):
    """One attempt as the attempts ledger keeps it; `started_us` is microseconds since the epoch."""

    attempt: int
    started_us: int
    duration_ms: float
    outcome: str
    error: ErrorInfo | None


WORKER_DIED = ErrorInfo(
    type="WorkerDied",
    message="the handler's Python worker process died during this attempt (the handler exited or crashed it)",
    stack="",
    signature="worker-died",
    code=None,
)


def _timed_out(seconds: float) -> HandlerTimeout:
    return HandlerTimeout(f"the handler ran longer than the handler_timeout of {seconds:g}s")


def call_with_timeout(handler: Callable[[Any], Any], message: Any, seconds: float | None) -> None:
    """Call the handler with a message (or a batch of them); past `seconds` the attempt aborts
    with HandlerTimeout."""
    if seconds is None:
        handler(message)
        return
    if threading.current_thread() is threading.main_thread():
        # A timer signal interrupts the handler's Python code in place, so a hung attempt
        # does not hold the worker.
        def on_alarm(signum: int, frame: Any) -> None:
            raise _timed_out(seconds)

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            handler(message)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    # Off the main thread no signal can be used: abandon the attempt's thread after the timeout.
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(handler, message).result(timeout=seconds)
    except FutureTimeout:
        raise _timed_out(seconds) from None
    finally:
        pool.shutdown(wait=False)


@dataclass(frozen=True, slots=True)
class Delivery:
    outcome: Outcome
    attempts: list[AttemptRecord]
    failures: int
    last_error: ErrorInfo | None
    # What the successful attempt sent to other queues; a failed attempt's sends are discarded.
    sent: list[Outgoing] = field(default_factory=list)
    # Failed attempts whose error points at an outage of a dependency (policy outage_errors).
    outage_failures: int = 0


def deliver(
    handler: Handler,
    make_message: Callable[[int], Message],
    max_attempts: int,
    timeout: float | None,
    classifier: Classifier,
    crashes: int = 0,
) -> Delivery:
    """Up to `max_attempts` attempts; stop at the first success or unrecoverable error. The first
    `crashes` attempts already happened: each killed the worker it ran in."""
    records = [AttemptRecord(k, time.time_ns() // 1000, 0.0, "crash", WORKER_DIED) for k in range(1, crashes + 1)] \
        if crashes else []
    error_info: ErrorInfo | None = WORKER_DIED if crashes else None
    outages = 0
    for attempt in range(crashes + 1, max_attempts + 1):
        started, clock = time.time_ns() // 1000, time.perf_counter()
        message = make_message(attempt)
        try:
            if timeout is None:
                handler(message)
            else:
                call_with_timeout(handler, message, timeout)
        except BaseException as error:  # noqa: BLE001 - a handler may raise anything at all
            error_info = classifier.describe(error)
            outcome = "timeout" if isinstance(error, HandlerTimeout) else "abort"
            records.append(AttemptRecord(attempt, started, (time.perf_counter() - clock) * 1000, outcome, error_info))
            if classifier.unrecoverable(error, error_info):
                return Delivery(Outcome.UNRECOVERABLE, records, len(records), error_info, outage_failures=outages)
            outages += classifier.outage(error)
            continue
        records.append(AttemptRecord(attempt, started, (time.perf_counter() - clock) * 1000, "success", None))
        return Delivery(Outcome.SUCCEEDED, records, len(records) - 1, error_info, message.outbox, outages)
    return Delivery(Outcome.EXHAUSTED, records, len(records), error_info, outage_failures=outages)
