"""A run that stays: after its cycle, it watches its table and runs the next cycle as soon as a
message is due, until its stay is over or other work of the queue waits for it. With sensors
looking every few seconds, this is what brings a message's wait below a second under steady traffic.

Between cycles the run holds nothing: operators' commands and other runs take the queue's lease
as they would between two runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from poison_pipeline.engine.cycle import CycleReport
from poison_pipeline.storage.tables import QueueTables

# How often a staying run asks whether its table changed: one small read (a HEAD on an object
# store) each time, and the most a new arrival waits for the run to see it.
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Clock:
    """The time sources of a stay, as one object so a test can drive them."""

    monotonic: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    sleep: Callable[[float], None] = time.sleep


def stay(cycle: Callable[[], CycleReport], tables: QueueTables, table: str, *, seconds: float,
         give_way: Callable[[], bool], clock: Clock = Clock()) -> Iterator[CycleReport]:
    """The reports of the cycles run while staying up to `seconds` from now, each started once a
    message of `table` is due; the stay ends early once `give_way()` says other work waits."""
    until = clock.monotonic() + seconds
    held = False
    while clock.monotonic() < until and not give_way():
        stats = tables.stats(table, clock.now())
        if stats.due_rows and not held:
            report = cycle()
            yield report
            # A cycle that took nothing though messages were due (a disabled queue) takes nothing
            # again until something changes: wait for a commit rather than spin.
            held = report.skipped is not None
            continue
        held = False
        mark = tables.log_mark(table, stats.version)
        # A message enqueued with a delay comes due without a commit: wake for it too.
        due_in = (stats.next_due - clock.now()).total_seconds() if stats.next_due else None
        wake = until if due_in is None else min(until, clock.monotonic() + max(0.0, due_in))
        while clock.monotonic() < wake and tables.unchanged_since(table, mark) and not give_way():
            clock.sleep(min(POLL_SECONDS, max(0.0, wake - clock.monotonic())))
