"""Durations as users write them in a declaration (`30m`, `2s`, `500ms`, `1h`, `PT30M` or seconds), and
the times they give operators' commands (ISO 8601, UTC unless they name a zone)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SHORT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_ISO = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration(value: object) -> timedelta:
    """Return `value` as a timedelta, or raise ValueError naming the accepted forms."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        return timedelta(seconds=float(value))
    if isinstance(value, str):
        short = _SHORT.match(value)
        if short:
            return timedelta(seconds=float(short.group(1)) * _UNITS[short.group(2)])
        iso = _ISO.match(value.strip())
        if iso and any(iso.groups()):
            days, hours, minutes, seconds = (float(g) if g else 0.0 for g in iso.groups())
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    raise ValueError(
        f"{value!r} is not a duration: write seconds (90), a number with a unit "
        "(500ms, 30s, 30m, 1h, 2d) or ISO 8601 (PT30M)"
    )


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; UTC when it names no zone. Raises ValueError with an example."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-22T10:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
