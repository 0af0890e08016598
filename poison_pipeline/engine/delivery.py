"""Delivering one message to its handler, attempt after attempt, on an executor.

Each attempt is isolated: whatever the handler raises (or a timeout) aborts that attempt only; a
handler the timeout cannot interrupt is killed with its worker (engine/watchdog.py), and the
cycle's careful re-run charges it (engine/cycle._stage).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter, time_ns
from typing import Any

from poison_pipeline.domain.envelope import Message, Outgoing
from poison_pipeline.domain.errors import Classifier, ErrorInfo, HandlerTimeout
from poison_pipeline.domain.routing import Outcome
from poison_pipeline.domain.user_code import call_with_timeout
from poison_pipeline.engine import output, watchdog

Handler = Callable[[Message], Any]


# One attempt as the attempts ledger keeps it: (attempt, started_us, duration_ms, outcome, error),
# `started_us` in microseconds since the epoch. A plain tuple, not a class: a cycle keeps one per
# attempt of a whole Arrow batch until the batch is written, and every such object the garbage
# collector tracks made it scan more (a NamedTuple per message cost a quarter of the loop's time).
AttemptRecord = tuple[int, int, float, str, ErrorInfo | None]
SUCCESS = "success"
# One attempt as `attempt` returns it: started_us, duration_ms, and what the handler raised, if anything.
Made = tuple[int, float, BaseException | None]


WORKER_DIED = ErrorInfo(
    type="WorkerDied",
    message="the handler's Python worker process died during this attempt (the handler exited or crashed it)",
    stack="",
    signature="worker-died",
    code=None,
)


def _timed_out(seconds: float) -> HandlerTimeout:
    return HandlerTimeout(f"the handler ran longer than the handler_timeout of {seconds:g}s")


def _killed(seconds: float) -> HandlerTimeout:
    return HandlerTimeout(f"the handler ran longer than the handler_timeout of {seconds:g}s and did not stop: "
                          f"its worker process was killed {watchdog.grace(seconds):g}s later")


# What a handler returns is ignored, except what means its body never ran: the coroutine of an
# `async def` handler and the generator of one that yields.
_UNRUN = (types.CoroutineType, types.GeneratorType, types.AsyncGeneratorType)


def _unrun(result: Any) -> TypeError:
    if isinstance(result, types.CoroutineType | types.GeneratorType):
        result.close()  # no "never awaited" warning in the worker's log
    kind = type(result).__name__
    return TypeError(f"the handler returned a {kind} instead of running: it is called synchronously, so an "
                     "`async def` handler (or one that yields) never runs its body; make it a plain function")


def _call(handler: Callable[[Any], Any], message: Any, seconds: float) -> Any:
    watchdog.arm(seconds)
    try:
        return call_with_timeout(handler, (message,), {}, seconds, lambda: _timed_out(seconds))
    finally:
        watchdog.disarm()


# Not frozen: one is built per delivered message, and a frozen dataclass's __init__ costs four times
# as much (object.__setattr__ per field). Nothing changes one after it is built, and nothing keeps
# it: Changes.set copies what it needs into its columns.
@dataclass(slots=True)
class Delivery:
    outcome: Outcome
    attempts: list[AttemptRecord]
    failures: int
    last_error: ErrorInfo | None
    # What the successful attempt sent to other queues; a failed attempt's sends are discarded.
    sent: list[Outgoing] = field(default_factory=list)
    # Failed attempts whose error points at an outage of a dependency (policy outage_errors).
    outage_failures: int = 0
    # The retry rule the last failure fell under (policy rules), if one did.
    rule: int | None = None


# Read once per delivered message: an enum member read through its class costs a descriptor call.
_SUCCEEDED, _EXHAUSTED, _UNRECOVERABLE = Outcome.SUCCEEDED, Outcome.EXHAUSTED, Outcome.UNRECOVERABLE

# How an attempt that killed its worker ended, as the careful re-run found it (engine/cycle._stage).
CRASH = "crash"
TIMEOUT = "timeout"


def attempt(handler: Callable[[Any], Any], message: Any, timeout: float | None) -> Made:
    """Call the handler with a message (or a batch of them) as one attempt: when it started
    (microseconds since the epoch), how long it ran (ms), and what it raised, if anything. Past
    `timeout` seconds the attempt aborts with HandlerTimeout (and past the grace after it, the
    watchdog kills the worker), and what it prints is bounded (engine/output.py)."""
    started, clock = time_ns() // 1000, perf_counter()
    output.begin(message)
    try:
        result = handler(message) if timeout is None else _call(handler, message, timeout)
        if result is not None and isinstance(result, _UNRUN):
            raise _unrun(result)
    except BaseException as error:  # noqa: BLE001 - a handler may raise anything at all
        return started, (perf_counter() - clock) * 1000, error
    finally:
        output.end()
    return started, (perf_counter() - clock) * 1000, None


def deliver(
    handler: Handler,
    make_message: Callable[[int], Message],
    max_attempts: int,
    timeout: float | None,
    classifier: Classifier,
    deaths: Sequence[str] = (),
    first: Made | None = None,
    rule_attempts: Sequence[int] = (),
) -> Delivery:
    """Up to `max_attempts` attempts; stop at the first success or unrecoverable error. The first
    attempts already happened and each killed the worker it ran in: `deaths` says how each ended,
    CRASH (the handler crashed or exited it) or TIMEOUT (the watchdog killed it: a HandlerTimeout).
    `first`: the first attempt, made by the caller (what `attempt` returned), which failed.
    `rule_attempts`: the attempts each retry rule allows; a failure a rule matches allows its
    number of attempts instead of `max_attempts`."""
    records: list[AttemptRecord] = []
    error_info: ErrorInfo | None = None
    outages = 0
    rule: int | None = None
    ceiling = max((max_attempts, *rule_attempts))

    def spent(number: int) -> bool:
        return number >= (max_attempts if rule is None else rule_attempts[rule])

    for number, death in enumerate(deaths, start=1) if deaths else ():
        started = time_ns() // 1000
        if death == TIMEOUT and timeout is not None:
            error = _killed(timeout)
            error_info = classifier.describe(error)
            records.append((number, started, 0.0, TIMEOUT, error_info))
            if classifier.unrecoverable(error, error_info):
                return Delivery(_UNRECOVERABLE, records, len(records), error_info, outage_failures=outages)
            outages += classifier.outage(error)
            rule = classifier.rule(error, error_info) if rule_attempts else None
        else:
            error_info = WORKER_DIED
            records.append((number, started, 0.0, CRASH, WORKER_DIED))
            rule = None
    if deaths and spent(len(deaths)):
        return Delivery(_EXHAUSTED, records, len(records), error_info, outage_failures=outages, rule=rule)
    for number in range(len(deaths) + 1, ceiling + 1):
        if first is None:
            message = make_message(number)
            started, duration, failure = attempt(handler, message, timeout)
        else:
            (started, duration, failure), first = first, None
        if failure is None:
            records.append((number, started, duration, SUCCESS, None))
            return Delivery(_SUCCEEDED, records, len(records) - 1, error_info, message.outbox, outages)
        error_info = classifier.describe(failure)
        outcome = TIMEOUT if isinstance(failure, HandlerTimeout) else "abort"
        records.append((number, started, duration, outcome, error_info))
        if classifier.unrecoverable(failure, error_info):
            return Delivery(_UNRECOVERABLE, records, len(records), error_info, outage_failures=outages)
        outages += classifier.outage(failure)
        rule = classifier.rule(failure, error_info) if rule_attempts else None
        if spent(number):
            break
    return Delivery(_EXHAUSTED, records, len(records), error_info, outage_failures=outages, rule=rule)
