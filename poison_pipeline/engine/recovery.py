"""Finishing a cycle that was killed after staging its results, for the next cycle of its table and
for every operator command that moves messages of the queue.

A `staged` journal entry means the cycle delivered and wrote its results, then stopped somewhere in
its commits: the messages it took may still sit in its waiting table while their outcomes are
staged. An operator command that moved such a message first would leave it in two places once the
cycle's commits land, so every holder of the queue's lease that moves messages finishes these
cycles before anything else. No Spark here: an operator command imports this module.
"""

from __future__ import annotations

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import cycle_number
from poison_pipeline.engine.commit import apply_staged, end_failed_conversations
from poison_pipeline.storage.journal import JournalEntry, read_entry, remove_tree, write_entry
from poison_pipeline.storage.tables import JOURNAL
from poison_pipeline.storage.writer import QueueWriter


def finish_staged(declaration: Declaration, writer: QueueWriter, entry: JournalEntry, fresh: bool) -> dict[str, float]:
    """Commit a staged cycle; `fresh` when this run staged it (not a recovery of an earlier run's)."""
    contracts = {name: queue.contract for name, queue in declaration.queues.items()}
    cycle = cycle_number(entry.table, declaration.queue(writer.tables.queue).policy)
    counts = apply_staged(writer, entry, cycle, contracts, fresh=fresh)
    # Before the cycle is marked done, so a crash here ends them on the re-run (ending is repeatable).
    if counts.get("ended"):
        counts.update(end_failed_conversations(declaration, writer, entry))
    entry.state, entry.summary = "done", counts
    write_entry(writer, entry)
    remove_tree(entry.staging, writer.tables.storage_options)
    return counts


def finish_interrupted_cycles(declaration: Declaration, writer: QueueWriter) -> dict[str, dict[str, float]]:
    """Finish every cycle of the queue left `staged`, by waiting table; call holding its lease.
    A cycle left `planned` committed nothing and is left to the next cycle of its table."""
    finished = {}
    for table in writer.tables.waiting:
        entry = read_entry(writer.tables, table, snapshot=writer.latest_if_exists(JOURNAL))
        if entry is not None and entry.state == "staged":
            writer.check()
            finished[table] = finish_staged(declaration, writer, entry, fresh=False)
    return finished
