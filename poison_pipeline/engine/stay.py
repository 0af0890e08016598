"""A run that stays: after its cycle, it watches its table and runs the next cycle as soon as a
message is due, until its stay is over or other work of the queue waits for it. Under steady
traffic a message then waits for a poll and a cycle, not for the next sensor evaluation and a run's start.

Between cycles the run holds nothing: operators' commands and other runs take the queue's lease
as they would between two runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from poison_pipeline.engine.cycle import CycleReport
from poison_pipeline.storage.tables import QueueTables

# How often a staying run asks whether its table changed (`unchanged_since`: two log entries, three
# requests on an object store), and the most a new arrival waits for the run to see it.
POLL_SECONDS = 0.25


def stay(cycle: Callable[[], CycleReport], tables: QueueTables, table: str, *, seconds: float,
         give_way: Callable[[], bool]) -> Iterator[CycleReport]:
    """The reports of the cycles run while staying up to `seconds` from now, each started once a
    message of `table` is due; the stay ends early once `give_way()` says other work waits."""
    until = time.monotonic() + seconds
    held = False
    while time.monotonic() < until and not give_way():
        stats = tables.stats(table, datetime.now(UTC))
        if stats.due_rows and not held:
            report = cycle()
            yield report
            # A cycle that took nothing though messages were due (a disabled queue) takes nothing
            # again until something changes: wait for a commit rather than spin.
            held = report.skipped is not None
            continue
        held = False
        mark = tables.log_mark(table, stats.version)
        # A message due later (a redrive at a rate spreads them) comes due without a commit: wake for it.
        due_in = (stats.next_due - datetime.now(UTC)).total_seconds() if stats.next_due else None
        wake = until if due_in is None else min(until, time.monotonic() + max(0.0, due_in))
        while time.monotonic() < wake and tables.unchanged_since(table, mark) and not give_way():
            time.sleep(min(POLL_SECONDS, max(0.0, wake - time.monotonic())))
