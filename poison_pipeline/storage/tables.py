"""The Delta tables of one application queue under the lake root, read and committed with delta-rs."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import ColumnProperties, CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import RemoveAction

from poison_pipeline.domain.declaration import Declaration, LeaseSettings
from poison_pipeline.domain.paths import lake_path, segment
from poison_pipeline.domain.routing import (
    DEAD_LETTER,
    INBOUND,
    POISON,
    PROCESSED,
    QUARANTINE,
    waiting_tables,
)
from poison_pipeline.storage import schemas
from poison_pipeline.storage.faults import writing
from poison_pipeline.storage.files import files_dataset, log_names
from poison_pipeline.storage.lease import LEASE_TABLE, Holder, Lease, check_held, current_holder, queue_lease

ATTEMPTS = "attempts"
EVENTS = "events"
NOTIFICATIONS = "notifications"
CONVERSATIONS = "conversations"
TRANSMISSION = "transmission"
ACTIONS = "actions"
EDITS = "edits"
PURGED = "purged"
# Not in `all_tables`: created with its opening balance by storage/intake.py.
INTAKE = "intake"
# Columns whose values are (nearly) all distinct: a dictionary never pays for them, and trying one
# first is the writer's default (without it, a 1,000,000-message cycle's `attempts` and `processed`
# appends went from 0.32 and 0.27 s to 0.20 and 0.19 s: benchmarks/README.md, session 11).
_DISTINCT = ("message_id", "id_hash", "body", "started_at", "duration_ms", "event_id", "notification_id",
             "source_message_id", "original_body", "new_body")
# delta-rs would write a million-row append as one row group, and Spark cannot split a row group:
# the whole batch would be one task on one core. Smaller groups let a cycle use every core.
WRITER = WriterProperties(max_row_group_size=65_536,
                          column_properties={name: ColumnProperties(dictionary_enabled=False) for name in _DISTINCT})


def schema_of(table: str) -> pa.Schema:
    if table in (INBOUND, POISON) or table.startswith("retry_"):
        return schemas.MESSAGE
    return {
        DEAD_LETTER: schemas.DEAD_LETTER,
        QUARANTINE: schemas.QUARANTINE,
        PROCESSED: schemas.PROCESSED,
        ATTEMPTS: schemas.ATTEMPTS,
        EVENTS: schemas.EVENTS,
        NOTIFICATIONS: schemas.NOTIFICATIONS,
        CONVERSATIONS: schemas.CONVERSATIONS,
        TRANSMISSION: schemas.TRANSMISSION,
        ACTIONS: schemas.ACTIONS,
        EDITS: schemas.EDITS,
        PURGED: schemas.PURGED,
        INTAKE: schemas.INTAKE,
    }[table]


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# The column that says when a row arrived in each table: the age of its oldest entry.
_ARRIVAL = {DEAD_LETTER: "dead_lettered_at", QUARANTINE: "quarantined_at", PROCESSED: "at",
            ATTEMPTS: "started_at", EVENTS: "at", NOTIFICATIONS: "at", CONVERSATIONS: "at",
            TRANSMISSION: "enqueued_at", ACTIONS: "at", EDITS: "at",
            PURGED: "purged_at", INTAKE: "at"}


@dataclass(frozen=True)
class TableStats:
    """What the transaction log alone says of a table: no data file is opened."""

    version: int
    rows: int
    files: int
    oldest: datetime | None
    due_rows: int
    due_batches: tuple[str, ...]
    due_files: tuple[str, ...]
    next_due: datetime | None
    # Columns null in every due file, by the log's statistics (null counts equal to row counts).
    null_columns: tuple[str, ...] = ()


def _null_columns(actions: pa.Table) -> tuple[str, ...]:
    """The columns null in every file of `actions` (flattened add actions), as far as their
    statistics show: a file without a column's null count proves nothing of it."""
    if actions.num_rows == 0:
        return ()
    rows = actions["num_records"]
    found = []
    for name in actions.column_names:
        if name.startswith("null_count."):
            nulls = pc.fill_null(pc.equal(actions[name], rows), False)
            if pc.all(nulls).as_py():
                found.append(name.removeprefix("null_count."))
    return tuple(found)


def _whole_due_files(due: np.ndarray, files: np.ndarray, batches: pa.Array) -> np.ndarray:
    """Which of the files (`due`: whether each is due) to take: the due files whose batches lie
    wholly in due files. `files[i]` holds batch `batches[i]` (one pair per file and batch in it).

    A cycle reads files and removes batches: the two are the same rows only when no batch it takes
    has rows in a file it does not read. A batch sharing a file with one not yet due waits for it.
    On arrays: a table of 10,000 one-batch files is decided without a Python step per file."""
    pair_due = due[files]
    held = pc.unique(batches.filter(pa.array(~pair_due)))
    while True:
        blocked = np.zeros(len(due), bool)
        blocked[files[pc.is_in(batches, value_set=held).to_numpy(zero_copy_only=False) & pair_due]] = True
        taken = due & ~blocked
        waiting = pc.unique(batches.filter(pa.array(pair_due & ~taken[files])))
        newly = waiting.filter(pc.invert(pc.is_in(waiting, value_set=held)))
        if len(newly) == 0:
            return taken
        held = pa.concat_arrays([held, newly])


def _whole_file_removes(target: DeltaTable, ids: pa.Array, read: Callable[[list[str]], pa.Table]
                        ) -> list[RemoveAction] | None:
    """The remove actions that delete the batches `ids` by dropping whole files, when every file
    holding one of them holds nothing else: the log's statistics show it for a file of one batch
    (every append writes its batch to files of its own); a file of several (compacted) is checked
    by `read`ing its batch ids (each row's, with its file's index in the paths given). None when a
    file mixes taken rows with others: delta-rs's delete must then rewrite it.

    delta-rs's delete reads every file of the table and matches each row against the list: one
    cycle taking 10,000 small enqueues' files spent 80 s in it, 2 s on their compacted file."""
    actions = pa.table(target.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    if "min.batch_id" not in actions.column_names:
        return None
    first, last = actions["min.batch_id"].combine_chunks(), actions["max.batch_id"].combine_chunks()
    # Statistics skip nulls: a file of batch X and rows with no batch id also reads min = max = X.
    nulls = actions["null_count.batch_id"] if "null_count.batch_id" in actions.column_names else None
    no_nulls = pc.fill_null(pc.equal(nulls, 0), False) if nulls is not None else pa.repeat(False, len(first))
    single = pc.and_(pc.fill_null(pc.equal(first, last), False), no_nulls)
    gone = pc.fill_null(pc.is_in(first, value_set=ids), False).to_numpy(zero_copy_only=False) \
        & single.to_numpy(zero_copy_only=False)
    # A file of several batches, or without statistics, whose range may hold a taken one.
    overlaps = pc.and_(pc.fill_null(pc.less_equal(first, pc.max(ids)), True),
                       pc.fill_null(pc.greater_equal(last, pc.min(ids)), True))
    mixed = np.flatnonzero(pc.and_(pc.invert(single), overlaps).to_numpy(zero_copy_only=False))
    if len(mixed):
        paths = actions["path"].take(pa.array(mixed)).to_pylist()
        rows = read(paths)
        taken = pc.fill_null(pc.is_in(rows["batch_id"], value_set=ids), False)  # a null batch id is never taken
        whole = pa.table({"file": rows["file"], "taken": taken}).group_by("file").aggregate(
            [("taken", "all"), ("taken", "any")])
        if pc.any(pc.and_(whole["taken_any"], pc.invert(whole["taken_all"]))).as_py():
            return None
        gone[mixed[whole["file"].filter(whole["taken_all"]).to_numpy()]] = True
    removed = actions.filter(pa.array(gone))
    now_ms = int(time.time() * 1000)
    return [RemoveAction(path, True, now_ms, size) for path, size in
            zip(removed["path"].to_pylist(), removed["size_bytes"].to_pylist(), strict=True)]


# An enqueue's append and a cycle's delete of the batches it took touch different files, yet delta-rs
# may refuse one of two such commits made at once ("a concurrent transaction deleted data this
# operation read"). Both are safe to make again on the newer table: a refused commit wrote nothing,
# an append with an app id is made once only, and deleting a deleted batch changes nothing.
_COMMIT_TRIES = 8
T = TypeVar("T")


def _again_on_conflict(commit: Callable[[int], T], tries: int = _COMMIT_TRIES) -> T:
    """`commit(attempt)`, made again after a growing, jittered pause while delta-rs refuses it for a
    concurrent commit, up to `tries` times."""
    attempt = 0
    while True:
        try:
            return commit(attempt)
        except CommitFailedError:
            attempt += 1
            if attempt == tries:
                raise
        time.sleep(min(2.0, 0.02 * 2 ** attempt) * (0.5 + random.random()))


@dataclass(frozen=True)
class QueueTables:
    lake_root: str
    queue: str
    storage_options: dict[str, str] = field(repr=False)  # credentials: never in a repr
    waiting: tuple[str, ...]
    lease_settings: LeaseSettings = LeaseSettings()

    @classmethod
    def of(cls, declaration: Declaration, queue: str) -> QueueTables:
        policy = declaration.queue(queue).policy
        return cls(
            lake_root=declaration.lake_root.rstrip("/"),
            queue=queue,
            storage_options=dict(declaration.storage_options),
            waiting=tuple(waiting_tables(policy)),
            lease_settings=declaration.lease,
        )

    @property
    def all_tables(self) -> tuple[str, ...]:
        return (*self.waiting, DEAD_LETTER, QUARANTINE, PROCESSED, ATTEMPTS, EVENTS, NOTIFICATIONS,
                CONVERSATIONS, TRANSMISSION, ACTIONS, EDITS, PURGED)

    def __post_init__(self) -> None:
        segment(self.queue, "queue name")

    def uri(self, table: str) -> str:
        return lake_path(self.lake_root, self.queue, table)

    def work_uri(self, *parts: str) -> str:
        """Where the cycle journal and staged results live, beside the tables."""
        return lake_path(self.lake_root, self.queue, "_work", *parts)

    def lease(self, purpose: str, run_id: str = "manual",
              on_wait: Callable[[Holder], None] | None = None) -> AbstractContextManager[Lease]:
        """Hold the queue's lease (one writer per queue) for a `with` block; see storage/lease.py."""
        return queue_lease(self.uri(LEASE_TABLE), self.queue, self.storage_options, self.lease_settings,
                           purpose, run_id, on_wait)

    def check_lease(self) -> None:
        """Before a commit: fail (LeaseLost) if this thread held the queue's lease and lost it."""
        check_held(self.uri(LEASE_TABLE))

    def lease_holder(self) -> Holder | None:
        """Who holds the queue's lease now, if anyone."""
        return current_holder(self.uri(LEASE_TABLE), self.storage_options)

    def ensure(self) -> None:
        """Create every table that does not exist yet (safe to call from several processes)."""
        for table in self.all_tables:
            if DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options):
                continue
            try:
                with writing("creating a table", self.describe(table)):
                    DeltaTable.create(
                        self.uri(table),
                        schema=schema_of(table),
                        partition_by=schemas.PARTITIONS.get(table),
                        mode="ignore",
                        storage_options=self.storage_options,
                    )
            except Exception:
                if not DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options):
                    raise

    def open_created(self, table: str) -> DeltaTable:
        """Open `table`; when it is missing (a first use, or tables deleted), create every table of
        the queue first. Unlike `ensure`, this costs nothing more than the open once they exist."""
        try:
            return self.open(table)
        except FileNotFoundError:
            self.ensure()
            return self.open(table)

    def describe(self, table: str) -> str:
        """How an error names a table: `table processed of queue 'orders' at /lake/orders/processed`."""
        return f"table {table} of queue {self.queue!r} at {self.uri(table)}"

    def open(self, table: str) -> DeltaTable:
        try:
            return DeltaTable(self.uri(table), storage_options=self.storage_options)
        except TableNotFoundError:
            raise FileNotFoundError(
                f"table {self.uri(table)} does not exist: the tables of queue {self.queue!r} "
                "are created by its first enqueue or cycle"
            ) from None

    def message_rows(self, table: str, message_id: str) -> list[dict[str, Any]]:
        """Every row of `message_id` in `table` (none when the table does not exist yet)."""
        if not self.exists(table):
            return []
        return self.open(table).to_pyarrow_dataset().to_table(
            filter=pads.field("message_id") == message_id).to_pylist()

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options)

    def append(self, table: str, data: Any, app_id: str | None = None, version: int = 0,
               also: Sequence[Transaction] = (), metadata: dict[str, str] | None = None,
               snapshot: DeltaTable | None = None, on_commit: Callable[[int], None] | None = None) -> bool:
        """Append `data`; with an app id, once only: a replay of a committed version writes nothing.
        `also` are further app transactions recorded by the same commit, `metadata` goes into its
        commit info (the log's history shows it). `snapshot`: the table as the caller just opened it
        (loading a long log again costs milliseconds). `on_commit` is called with the version committed."""
        def once(attempt: int) -> bool:
            self.check_lease()
            target = snapshot if snapshot is not None and attempt == 0 else self.open(table)
            transactions = list(also)
            if app_id is not None:
                # `or -1` would read a committed version 0 as "never committed".
                committed = target.transaction_version(app_id)
                if committed is not None and committed >= version:
                    return False
                transactions.append(Transaction(app_id, version))
            properties = CommitProperties(app_transactions=transactions, custom_metadata=metadata) \
                if transactions or metadata else None
            with writing("appending to a table", self.describe(table)):
                write_deltalake(
                    target,
                    data,
                    mode="append",
                    partition_by=schemas.PARTITIONS.get(table),
                    commit_properties=properties,
                    writer_properties=WRITER,
                    # A table made by an earlier version gains the columns added since (redrive_count).
                    schema_mode="merge",
                )
            if on_commit is not None:
                on_commit(target.version())
            return True

        # A stream is read once by the write: only a table can be written again.
        return _again_on_conflict(once, 1 if isinstance(data, pa.RecordBatchReader) else _COMMIT_TRIES)

    def remove_batches(self, table: str, batch_ids: Iterable[str]) -> None:
        """Delete whole batches; deleting an already deleted batch changes nothing."""
        ids = sorted(set(batch_ids))
        if not ids:
            return
        self.check_lease()
        quoted = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)

        def once(attempt: int) -> None:
            target = self.open(table)
            with writing("deleting taken batches from a table", self.describe(table)):
                removes = None if schemas.PARTITIONS.get(table) else _whole_file_removes(
                    target, pa.array(ids, pa.string()), lambda paths: self._batch_ids_of(table, paths))
                if removes is None:
                    target.delete(f"batch_id IN ({quoted})")
                elif removes:
                    # The log's history shows it as an append (delta-rs names no other operation here).
                    noted = CommitProperties(custom_metadata={"poison_pipeline.removed_batches": str(len(ids))})
                    target.create_write_transaction(removes, "append", target.schema(), commit_properties=noted)

        _again_on_conflict(once)

    def _batch_ids_of(self, table: str, paths: list[str]) -> pa.Table:
        """The batch id of every row of the files `paths` (as the log names them), and its file's
        index in `paths`."""
        rows = files_dataset(self.uri(table), self.storage_options, paths, None, schema_of(table)).to_table(
            columns=["batch_id", "__filename"])
        names = pc.unique(rows["__filename"])
        where = {path: i for i, path in enumerate(paths)}
        index = pa.array([where[name] for name in log_names(names.to_pylist(), paths)], pa.int64())
        return pa.table({"batch_id": rows["batch_id"],
                         "file": pc.take(index, pc.index_in(rows["__filename"], value_set=names))})

    def replace_batches(self, table: str, batch_ids: Iterable[str | None], keep: pads.Expression,
                        snapshot: DeltaTable | None = None, add: pa.Table | None = None) -> None:
        """Rewrite whole batches in one commit, keeping only their rows that match `keep`.

        delta-rs's delete writes a partly deleted file back with string_view columns, which pyarrow
        cannot filter on (delta-rs issue 4579): a later filtered read of the table would fail. The
        kept rows are streamed and written here instead, as plain strings, and a batch still sits
        in files of its own; `add` rows are written in the same commit. Given the `snapshot` the
        caller read the batches from, the commit fails if another one removed them since (a cycle
        that took them) instead of silently doing nothing.
        """
        ids = set(batch_ids)
        named = sorted(i for i in ids if i is not None)
        clauses = [f"batch_id IN ({', '.join(_quoted(i) for i in named)})"] if named else []
        within = pads.field("batch_id").isin(named)
        if None in ids:
            clauses.append("batch_id IS NULL")
            within = within | pads.field("batch_id").is_null()
        if not clauses:
            return
        self.check_lease()
        target = snapshot if snapshot is not None else self.open(table)
        kept: Any = target.to_pyarrow_dataset().scanner(filter=within & keep).to_reader()
        if add is not None:
            # Rows added in the same commit must carry one of the batch ids, or the overwrite refuses them.
            kept = pa.concat_tables([kept.read_all().cast(schema_of(table)), add.cast(schema_of(table))])
        with writing("rewriting batches of a table", self.describe(table)):
            write_deltalake(target, kept, mode="overwrite", predicate=" OR ".join(clauses),
                            writer_properties=WRITER)

    @staticmethod
    def _batches_of_files(target: DeltaTable, actions: pa.Table) -> tuple[np.ndarray, pa.Array]:
        """The batch ids in each file, as (file index, batch id) pairs: its statistics name them when
        a file holds one batch, as every append writes; a file that a rewrite left with several is
        read (one narrow column)."""
        first, last = actions["min.batch_id"].combine_chunks(), actions["max.batch_id"].combine_chunks()
        single = pc.fill_null(pc.equal(first, last), False).to_numpy(zero_copy_only=False)
        files, batches = [np.flatnonzero(single)], [first.filter(pa.array(single))]
        mixed = np.flatnonzero(~single)
        if len(mixed):
            fragments = {f.path: f for f in target.to_pyarrow_dataset().get_fragments()}
            paths = actions["path"].to_pylist()
            for index in mixed:
                ids = pc.unique(fragments[paths[index]].to_table(columns=["batch_id"])["batch_id"])
                files.append(np.full(len(ids), index))
                batches.append(ids)
        return np.concatenate(files), pa.concat_arrays(batches)

    def stats(self, table: str, now: datetime) -> TableStats:
        """Rows, oldest entry and due batches of a table, from the Delta log's file statistics (and
        the batch ids of the few files that a rewrite left holding several batches)."""
        target = self.open(table)
        actions = pa.table(target.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return TableStats(target.version(), 0, 0, None, 0, (), (), None)
        rows = actions["num_records"].combine_chunks()
        oldest_col = f"min.{_ARRIVAL.get(table, 'entered_at')}"
        oldest = pc.min(actions[oldest_col]).as_py() if oldest_col in actions.column_names else None
        due_rows, due_files, due_batches, next_due, null_columns = 0, (), (), None, ()
        if "max.due_at" in actions.column_names:
            dues = actions["max.due_at"].combine_chunks()
            due = pc.fill_null(pc.less_equal(dues, pa.scalar(now).cast(dues.type)), False).to_numpy(
                zero_copy_only=False)
            files, batches = self._batches_of_files(target, actions)
            taken = _whole_due_files(due, files, batches)
            picked = pa.array(taken)
            due_rows = pc.sum(rows.filter(picked)).as_py() or 0
            root = self.uri(table)
            due_files = tuple(f"{root}/{p}" for p in actions["path"].combine_chunks().filter(picked).to_pylist())
            due_batches = tuple(pc.unique(batches.filter(pa.array(taken[files]))).sort().to_pylist())
            # A due file held back waits for one of those not due yet.
            later = pc.fill_null(pc.greater(dues, pa.scalar(now).cast(dues.type)), False)
            next_due = pc.min(dues.filter(pc.and_(later, pa.array(~taken)))).as_py()
            null_columns = _null_columns(actions.filter(picked))
        return TableStats(
            version=target.version(),
            rows=pc.sum(rows).as_py() or 0,
            files=actions.num_rows,
            oldest=oldest,
            due_rows=due_rows,
            due_batches=due_batches,
            due_files=due_files,
            next_due=next_due,
            null_columns=null_columns,
        )
