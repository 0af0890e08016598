"""Durations as users write them in a declaration (`30m`, `2s`, `500ms`, `1h`, `PT30M` or seconds), and
the times they give operators' commands (ISO 8601, UTC unless they name a zone)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# A number with no unit is seconds, as in a YAML number or on a command line ("90", "0").
_SHORT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


# Longer than any retention or delay means anything, short enough that now plus or minus it is a date.
LONGEST = timedelta(days=365_000)


def parse_duration(value: object) -> timedelta:
    """Return `value` as a timedelta, or raise ValueError naming the accepted forms."""
    if isinstance(value, timedelta):
        return _bounded(value, value)
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        return _bounded(_seconds(float(value), value), value)
    if isinstance(value, str):
        short = _SHORT.fullmatch(value)
        if short:
            return _bounded(_seconds(float(short.group(1)) * _UNITS[short.group(2) or "s"], value), value)
        iso = _ISO.fullmatch(value.strip())
        if iso and any(iso.groups()):
            days, hours, minutes, seconds = (float(g) if g else 0.0 for g in iso.groups())
            return _bounded(_seconds(days * 86400 + hours * 3600 + minutes * 60 + seconds, value), value)
    raise ValueError(
        f"{value!r} is not a duration: write seconds (90), a number with a unit "
        "(500ms, 30s, 30m, 1h, 2d) or ISO 8601 (PT30M)"
    )


def _seconds(seconds: float, value: object) -> timedelta:
    if math.isnan(seconds):
        raise ValueError(f"{value!r} is not a duration: NaN is no number of seconds")
    if abs(seconds) > LONGEST.total_seconds():
        raise ValueError(f"{value!r} is longer than {LONGEST.days} days (about 1000 years), the longest duration")
    return timedelta(seconds=seconds)


def _bounded(duration: timedelta, value: object) -> timedelta:
    if abs(duration) > LONGEST:
        raise ValueError(f"{value!r} is longer than {LONGEST.days} days (about 1000 years), the longest duration")
    return duration


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; UTC when it names no zone. Raises ValueError with an example."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-22T10:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_moment(text: str, *, now: datetime) -> datetime:
    """A moment as operators give one: an age before `now` (90, 30m, 1h, 7d) or an ISO 8601 time.
    Raises ValueError naming both forms."""
    try:
        return now - parse_duration(text)
    except ValueError as not_an_age:
        if _SHORT.fullmatch(text) or _ISO.fullmatch(text.strip()):
            raise  # an age out of bounds: its own message says which bound
        try:
            return parse_time(text)
        except ValueError:
            raise ValueError(f"{text!r} is neither an age (90, 30m, 1h, 7d) nor an ISO 8601 time "
                             "(2026-11-22T10:00Z)") from not_an_age


def when(moment: datetime | None) -> str:
    """A moment as the operator's output shows it (UTC, to the second); '-' for none."""
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")


def spoken(duration: timedelta) -> str:
    """A duration as people read it: `850ms`, `45.2s`, `12m 5s`, `3h 20m`, `2d 4h`."""
    seconds = duration.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s".replace(".0s", "s")
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count >= 1:
            parts.append(f"{int(count)}{unit}")
    return " ".join(parts[:2])


# A duration field of a declaration: any of `parse_duration`'s forms.
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
