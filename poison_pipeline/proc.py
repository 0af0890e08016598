"""One reading of /proc for a process's state and identity (Linux): whether it runs, and when it
started, which with its pid names one process even after the pid is reused."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int | str = "self") -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses), or
    None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it has exited and waits to be reaped)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def process_start(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (field 22), None when it is gone."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields else None


def same_process(pid: int, start: int | None) -> bool:
    """Whether `pid` is still the live process that started at `start` (not a reuse of its pid)."""
    return alive(pid) and (start is None or process_start(pid) == start)
