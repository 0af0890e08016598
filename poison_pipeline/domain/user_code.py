"""The one way the product calls code a user declared (handlers, clean-up hooks, alert hooks): with a
time limit, and whatever it raises kept as the call's outcome, never raised into the product.

On the main thread a timer signal interrupts the user's Python code in place; off it, no signal can
be used, so the call runs in a thread of its own that is abandoned at the limit (the process goes
on; the thread ends when the code does). A handler's worker process is also watched from outside
(engine/watchdog.py), for code the signal cannot interrupt.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import timedelta
from typing import Any

from poison_pipeline.domain.errors import HandlerTimeout
from poison_pipeline.domain.imports import import_callable

__all__ = ["DEFAULT_HOOK_TIMEOUT", "HookTimeout", "call_hook", "call_with_timeout"]

# How long a clean-up or alert hook may run when the declaration does not say (`hook_timeout`).
DEFAULT_HOOK_TIMEOUT = timedelta(seconds=60)


class HookTimeout(HandlerTimeout):
    """A clean-up or alert hook ran longer than the declaration's hook_timeout."""


def call_with_timeout(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float,
                      timed_out: Callable[[], BaseException]) -> Any:
    """`function(*args, **kwargs)`, or `timed_out()` raised once it has run `seconds`."""
    if threading.current_thread() is threading.main_thread():
        return _on_main_thread(function, args, kwargs, seconds, timed_out)
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(function, *args, **kwargs).result(timeout=seconds)
    except FutureTimeout:
        raise timed_out() from None
    finally:
        pool.shutdown(wait=False)


def _on_main_thread(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float,
                    timed_out: Callable[[], BaseException]) -> Any:
    def on_alarm(signum: int, frame: Any) -> None:
        raise timed_out()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return function(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call_hook(path: str, timeout: timedelta, *args: Any, **kwargs: Any) -> Exception | None:
    """Call the clean-up or alert hook at the import path `path` within `timeout`: what it raised
    (a HookTimeout past the limit, a ValueError when it cannot be imported), or None when it
    returned."""
    seconds = timeout.total_seconds()

    def timed_out() -> HookTimeout:
        return HookTimeout(f"the hook {path} ran longer than the hook_timeout of {seconds:g}s")

    try:
        call_with_timeout(import_callable(path), args, kwargs, seconds, timed_out)
    except Exception as error:  # the application's code: whatever it raises is its outcome
        return error
    return None
