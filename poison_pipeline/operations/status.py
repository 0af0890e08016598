"""`status`: per table of a queue, its counts, oldest age and due messages, and whether it is enabled.

Counts come from the Delta log's file statistics, so status stays fast with millions of rows. The
breakdowns (dead-letter and quarantine by reason, the ledger by disposition, the purged ledger by the
table its messages were purged from) come from the log too wherever a file holds a single value;
only files that mix values have that one column read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import DeltaTable

from poison_pipeline.broker.conversations import UnfinishedCleanup, unfinished_cleanups
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.paths import lake_path
from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND, PROCESSED, QUARANTINE, tables_through
from poison_pipeline.storage.control import queue_state
from poison_pipeline.storage.lease import Holder
from poison_pipeline.storage.tables import ATTEMPTS, CONVERSATIONS, PURGED, QueueTables, draining_retry
from poison_pipeline.storage.uri import fs_of

WAITING = "waiting"
TERMINAL = "terminal"
LEDGER = "ledger"

# When a row arrived in a terminal table: its age there is what an operator acts on (the stats'
# `entered_at` of these rows is when the message entered the waiting table it failed in).
_BREAKDOWN = {DEAD_LETTER: "reason", QUARANTINE: "reason", PROCESSED: "disposition", PURGED: "from_table"}
_LEDGERS = (PROCESSED, PURGED)
NO_VALUE = "(none)"


@dataclass(frozen=True)
class TableStatus:
    table: str
    kind: str
    exists: bool
    rows: int = 0
    version: int | None = None
    oldest: datetime | None = None
    oldest_age_s: float | None = None
    due: int | None = None
    next_due: datetime | None = None
    by: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueStatus:
    queue: str
    checked_at: datetime
    enabled: bool
    reason: str | None
    actor: str | None
    since: datetime | None
    tables: tuple[TableStatus, ...]
    # Conversations ended with an error (`end-conversation`), from the Delta log's row count.
    ended_conversations: int = 0
    # Ended conversations whose clean-up hook has not succeeded yet (each cycle retries them).
    unfinished_cleanups: tuple[UnfinishedCleanup, ...] = ()
    # Who holds the queue's lease (a cycle, a transmission or an operator command at work), if anyone.
    lease_holder: Holder | None = None
    # Messages deleted for good (`purge`, retention): `by` counts them per table they were purged from.
    purged: TableStatus = TableStatus(PURGED, LEDGER, exists=False)
    # Set for a folder of the lake holding a queue's messages that no declared queue names (one
    # removed or renamed while they waited): what is there and what to do.
    undeclared: str | None = None

    def table(self, name: str) -> TableStatus:
        for status in self.tables:
            if status.table == name:
                return status
        raise KeyError(f"queue {self.queue!r} has no table {name!r}")


def queue_status(declaration: Declaration, queue: str, now: datetime) -> QueueStatus:
    """The status of `queue`; KeyError (naming the declared queues) if it is not declared."""
    tables = QueueTables.of(declaration, queue)
    state = queue_state(tables)
    statuses = [
        *(_waiting(tables, table, now) for table in tables.waiting),
        *(_terminal(tables, table, now) for table in (DEAD_LETTER, QUARANTINE, PROCESSED)),
        _attempts(tables, now),
    ]
    ended = tables.stats(CONVERSATIONS, now).rows if tables.exists(CONVERSATIONS) else 0
    return QueueStatus(queue, now, state.enabled, state.reason, state.actor, state.since, tuple(statuses),
                       ended, tuple(unfinished_cleanups(declaration, tables)), tables.lease_holder(),
                       _terminal(tables, PURGED, now))


def undeclared_statuses(declaration: Declaration, now: datetime) -> list[QueueStatus]:
    """The status of each queue the lake holds messages of that the declaration does not declare
    (removed or renamed while they waited): no cycle reaches them, so status names them. Only
    the tables that hold messages (waiting and failure tables) are read."""
    root = declaration.lake_root.rstrip("/")
    options = dict(declaration.storage_options)
    fs, path = fs_of(root, options)
    found: list[QueueStatus] = []
    for info in sorted(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)), key=lambda i: i.base_name):
        name = info.base_name
        if info.type != pafs.FileType.Directory or name in declaration.queues or name.startswith(("_", ".")):
            continue
        try:
            waiting = tuple(tables_through(draining_retry(root, name, options, 0)))
            tables = QueueTables(root, name, options, waiting)
        except ValueError:
            continue  # not a name a queue can have: not a queue's folder
        if not tables.exists(INBOUND):
            continue
        statuses = (*(_waiting(tables, table, now) for table in waiting),
                    *(_terminal(tables, table, now) for table in (DEAD_LETTER, QUARANTINE)))
        held = sum(t.rows for t in statuses)
        if not held:
            continue
        note = (f"{held} message(s) in {lake_path(root, name)}, which no declared queue names (removed or renamed "
                f"while they waited): no cycle reaches them. Declare queue {name!r} again to drain them or redrive "
                "them --to another queue, or delete its folder if they are not wanted")
        found.append(QueueStatus(name, now, False, None, None, None, statuses, undeclared=note))
    return found


def _age(now: datetime, oldest: datetime | None) -> float | None:
    return None if oldest is None else max((now - oldest).total_seconds(), 0.0)


def _waiting(tables: QueueTables, table: str, now: datetime) -> TableStatus:
    if not tables.exists(table):
        return TableStatus(table, WAITING, exists=False)
    stats = tables.stats(table, now)
    return TableStatus(
        table, WAITING, True, stats.rows, stats.version, stats.oldest, _age(now, stats.oldest),
        due=stats.due_rows, next_due=stats.next_due,
    )


def _attempts(tables: QueueTables, now: datetime) -> TableStatus:
    if not tables.exists(ATTEMPTS):
        return TableStatus(ATTEMPTS, LEDGER, exists=False)
    stats = tables.stats(ATTEMPTS, now)
    return TableStatus(ATTEMPTS, LEDGER, True, stats.rows, stats.version, stats.oldest,
                       _age(now, stats.oldest))


def _terminal(tables: QueueTables, table: str, now: datetime) -> TableStatus:
    kind = LEDGER if table in _LEDGERS else TERMINAL
    if not tables.exists(table):
        return TableStatus(table, kind, exists=False)
    stats = tables.stats(table, now)
    if stats.files == 0:
        return TableStatus(table, kind, True, 0, stats.version)
    target = tables.open(table)
    actions = pa.table(target.get_add_actions(flatten=True))
    return TableStatus(table, kind, True, stats.rows, stats.version, stats.oldest, _age(now, stats.oldest),
                       by=_count_by(target, actions, _BREAKDOWN[table]))


def _count_by(target: DeltaTable, actions: pa.Table, column: str) -> dict[str, int]:
    """Rows per value of `column`: from the log where a file's min equals its max and it has no
    nulls, reading the column only from the other files."""
    names = set(actions.column_names)
    if not {f"min.{column}", f"max.{column}", f"null_count.{column}"} <= names:
        dataset = target.to_pyarrow_dataset()
        return _read_counts(dataset, column, list(dataset.get_fragments()))
    counts: Counter[str] = Counter()
    mixed: set[str] = set()
    for path, rows, low, high, nulls in zip(
        actions.column("path").to_pylist(),
        actions.column("num_records").to_pylist(),
        actions.column(f"min.{column}").to_pylist(),
        actions.column(f"max.{column}").to_pylist(),
        actions.column(f"null_count.{column}").to_pylist(),
        strict=True,
    ):
        # Truncated string statistics make min and max differ, so they land in `mixed`: safe.
        if rows is None or low is None or low != high or nulls != 0:
            mixed.add(path)
        else:
            counts[low] += rows
    if mixed:
        dataset = target.to_pyarrow_dataset()
        fragments = [f for f in dataset.get_fragments() if f.path in mixed]
        if len(fragments) != len(mixed):
            # The dataset names some file differently from the log: count the whole column.
            return _read_counts(dataset, column, list(dataset.get_fragments()))
        counts.update(_read_counts(dataset, column, fragments))
    return dict(sorted(counts.items()))


def _read_counts(dataset: pads.Dataset, column: str,
                 fragments: list[pads.Fragment]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for fragment in fragments:
        values = fragment.to_table(columns=[column], schema=dataset.schema).column(column)
        for item in pc.value_counts(values).to_pylist():
            counts[item["values"] if item["values"] is not None else NO_VALUE] += item["counts"]
    return dict(sorted(counts.items()))
