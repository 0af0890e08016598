"""Queues' status as tables: depth, age, state."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table

from poison_pipeline.domain.durations import when
from poison_pipeline.operations.status import QueueStatus
from poison_pipeline.text.render import render


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size}{unit}" + (f" {rest}{sub}" if rest else "")
    return f"{whole}s"


def _state_line(status: QueueStatus) -> str:
    if status.undeclared is not None:
        return f"{status.queue}: NOT DECLARED: {status.undeclared}"
    busy = f"\n  busy: lease held by {status.lease_holder.describe()}" if status.lease_holder else ""
    if status.enabled:
        head = f"{status.queue}: ENABLED"
        if status.since is not None:
            head += f" (since {when(status.since)} by {status.actor}: {status.reason})"
        return head + busy
    return (
        f"{status.queue}: DISABLED since {when(status.since)} by {status.actor}: {status.reason}"
        f"  (re-enable with `poison-pipeline enable {status.queue}`)"
    ) + busy


def _tables(status: QueueStatus) -> Table:
    table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
    for title in ("table", "rows", "oldest", "due", "next due", "by reason / disposition / purged from"):
        table.add_column(title, justify="right" if title in ("rows", "due") else "left")
    for t in (*status.tables, status.purged):
        table.add_row(
            t.table,
            str(t.rows) if t.exists else "-",
            format_age(t.oldest_age_s) if t.exists else "(not created yet)",
            "" if t.due is None else str(t.due),
            "" if t.next_due is None else when(t.next_due),
            " ".join(f"{k}={v}" for k, v in t.by.items()),
        )
    return table


def format_status(statuses: Sequence[QueueStatus]) -> str:
    """A table per queue, for people; `--json` gives the same data for programs."""
    return "\n\n".join(
        "\n".join([_state_line(s), *("  " + line.rstrip() for line in render(_tables(s)).splitlines()),
                   *_ended_line(s)])
        for s in statuses
    )


def _ended_line(status: QueueStatus) -> list[str]:
    if not status.ended_conversations:
        return []
    lines = [f"  conversations ended with an error: {status.ended_conversations}"
             " (their messages are in dead_letter, reason conversation_ended)"]
    if status.unfinished_cleanups:
        lines.append(f"  CLEAN-UP HOOK FAILING for {len(status.unfinished_cleanups)} ended conversation(s), "
                     "retried every cycle (or run end-conversation again):")
        lines += [f"    {u.conversation_id!r}: {u.failures} failed tries; last: {u.last_error}"
                  for u in status.unfinished_cleanups]
    return lines
