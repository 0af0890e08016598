"""Clean-up hooks the tests declare as `on_conversation_end`; they run in the test process."""

from __future__ import annotations

import time
from typing import Any

# Every call of `record`, in order; tests clear it (see the `hook_calls` fixture).
CALLS: list[dict[str, Any]] = []
# How many more calls of `flaky` raise before it starts to succeed.
FAILURES_LEFT = [0]


class StateStoreDown(Exception):  # noqa: N818 - the name a user would see in the report
    pass


def record(**kwargs: Any) -> None:
    CALLS.append(kwargs)


def flaky(**kwargs: Any) -> None:
    if FAILURES_LEFT[0] > 0:
        FAILURES_LEFT[0] -= 1
        raise StateStoreDown(f"cannot drop the state of {kwargs['conversation_id']}")
    CALLS.append(kwargs)


# How long each call of `slow` sleeps before it records the call.
SLEEP = [0.0]


def slow(**kwargs: Any) -> None:
    time.sleep(SLEEP[0])
    CALLS.append(kwargs)
