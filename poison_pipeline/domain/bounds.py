"""Bounds at the door: the numbers an operator gives (a rate, a limit, a version, a ramp's steps)
within what the product's arithmetic can hold, checked before anything is read or written.

Ages and other durations are bounded by `durations.LONGEST` where they are parsed. A redrive's rate
dates its messages `now + i / rate`: a rate so slow that the last of them would be due more than
LONGEST from now is refused (a tiny rate would otherwise overflow Python's dates, or date messages
centuries ahead). Counts and versions are refused past what the lake's 64-bit integers hold (Delta
versions, Arrow's row counts and offsets).
"""

from __future__ import annotations

import math

from poison_pipeline.domain.durations import LONGEST

# The largest count or version: Delta's versions and Arrow's lengths are signed 64-bit integers.
LARGEST_COUNT = 2**63 - 1
# One message per LONGEST: any slower and even two messages would be spread over more than it.
SLOWEST_RATE = 1 / LONGEST.total_seconds()
_LONGEST_SAID = f"{LONGEST.days} days (about 1000 years), the longest duration"


def bounded_count(value: int, smallest: int = 0) -> int:
    """`value`, a count or a version, from `smallest` to LARGEST_COUNT; ValueError (starting with
    the value, as the request's errors do) otherwise."""
    if not smallest <= value <= LARGEST_COUNT:
        raise ValueError(f"{value!r}: give a whole number from {smallest} to {LARGEST_COUNT} (2**63 - 1)")
    return value


def bounded_rate(rate: float) -> float:
    """`rate` (messages a second), positive and no slower than SLOWEST_RATE; ValueError otherwise."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"{rate!r}: give a positive number of messages per second")
    if rate < SLOWEST_RATE:
        raise ValueError(f"{rate!r}: give at least {_up(SLOWEST_RATE):g} messages per second: one per "
                         f"{_LONGEST_SAID}")
    return rate


def spread_problem(count: int, rate: float) -> str | None:
    """Why `count` messages cannot be released at `rate` a second (the last would be due more than
    LONGEST from now), or None when they can."""
    bounded_rate(rate)
    if count < 2 or (count - 1) / rate <= LONGEST.total_seconds():
        return None
    slowest = (count - 1) / LONGEST.total_seconds()
    return (f"--rate {rate:g}/s would release {count} messages over more than {_LONGEST_SAID}: give a rate of "
            f"at least {_up(slowest):g}/s, or fewer messages (--limit)")


def _up(rate: float) -> float:
    """`rate` rounded up to 3 significant digits: a rate the message suggests is one accepted."""
    step = 10.0 ** (math.floor(math.log10(rate)) - 2)
    return math.ceil(rate / step) * step
