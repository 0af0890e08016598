"""The Delta tables of one application queue under the lake root, read and committed with delta-rs."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import ColumnProperties, DeltaTable, WriterProperties
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from poison_pipeline.domain.declaration import Declaration, LeaseSettings
from poison_pipeline.domain.paths import lake_path, segment
from poison_pipeline.domain.routing import (
    DEAD_LETTER,
    INBOUND,
    POISON,
    PROCESSED,
    QUARANTINE,
    tables_through,
    waiting_tables,
)
from poison_pipeline.storage import schemas
from poison_pipeline.storage.faults import writing
from poison_pipeline.storage.lease import LEASE_TABLE, Holder, current_holder
from poison_pipeline.storage.uri import absent, fs_of, fs_of_all, whole_in

ATTEMPTS = "attempts"
EVENTS = "events"
NOTIFICATIONS = "notifications"
CONVERSATIONS = "conversations"
TRANSMISSION = "transmission"
ACTIONS = "actions"
EDITS = "edits"
PURGED = "purged"
# Failed messages an operator archived ("known, ignore it"): a marker per row, which stays where it is.
ARCHIVED = "archived"
# The cycle journal: one row per waiting table (storage/journal.py).
JOURNAL = "journal"
# Operator actions' plans: one row per part of a plan (storage/plans.py).
PLANS = "plans"
# Not in `all_tables`: created with its opening balance by storage/intake.py.
INTAKE = "intake"
# Columns whose values are (nearly) all distinct: a dictionary never pays for them, and trying one
# first is the writer's default (without it, a 1,000,000-message cycle's `attempts` and `processed`
# appends went from 0.32 and 0.27 s to 0.20 and 0.19 s: benchmarks/README.md, commit 15b7750).
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
        ARCHIVED: schemas.ARCHIVED,
        INTAKE: schemas.INTAKE,
        JOURNAL: schemas.JOURNAL,
        PLANS: schemas.PLANS,
    }[table]


def _mark(version: int, entry: pafs.FileInfo) -> str | None:
    """A log entry as `QueueTables.log_mark` names it; None when the store has no such entry."""
    return None if entry.type == pafs.FileType.NotFound else f"{version}/{entry.size}/{entry.mtime_ns}"


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# The column that says when a row arrived in each table: the age of its oldest entry.
_ARRIVAL = {DEAD_LETTER: "dead_lettered_at", QUARANTINE: "quarantined_at", PROCESSED: "at",
            ATTEMPTS: "started_at", EVENTS: "at", NOTIFICATIONS: "at", CONVERSATIONS: "at",
            TRANSMISSION: "enqueued_at", ACTIONS: "at", EDITS: "at",
            PURGED: "purged_at", ARCHIVED: "archived_at", INTAKE: "at"}


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
    due_sizes: tuple[int, ...] = ()  # of due_files, in bytes, as the log gives them


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


def _first_batches(taken: np.ndarray, files: np.ndarray, batches: pa.Array, rows: np.ndarray,
                   limit: int) -> np.ndarray:
    """Of the `taken` files, the first (in log order) whose batches hold at least `limit` rows, with
    every other taken file that holds one of their batches: a cycle still removes whole batches."""
    held: dict[int, set[str]] = {}
    for file, batch in zip(files.tolist(), batches.to_pylist(), strict=True):
        held.setdefault(file, set()).add(batch)
    chosen = np.zeros(len(taken), bool)
    names: set[str] = set()
    for file in np.flatnonzero(taken).tolist():
        if int(rows[chosen].sum()) >= limit:
            break
        names |= held.get(file, set())
        # Every taken file holding a chosen batch comes too (and its batches with it).
        grew = True
        while grew:
            grew = False
            for other in np.flatnonzero(taken & ~chosen).tolist():
                if held.get(other, set()) & names or other == file:
                    chosen[other] = True
                    grew |= not held.get(other, set()) <= names
                    names |= held.get(other, set())
    return chosen


def whole_file_removes(target: DeltaTable, ids: pa.Array, read: Callable[[list[str]], pa.Table]
                        ) -> list[AddAction | RemoveAction] | None:
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


_RETRY = re.compile(r"retry_([1-9][0-9]*)")


def draining_retry(lake_root: str, queue: str, storage_options: dict[str, str], cycles: int) -> int:
    """The last retry subqueue beyond the policy's `cycles` that still holds messages (0: none):
    a declaration with more retry cycles left them there, and they drain as waiting tables
    (routing.waiting_tables). One listing of the queue's folder; a table is opened only when one
    beyond the policy's count is there, the highest first."""
    fs, path = fs_of(lake_path(lake_root, queue), storage_options)
    try:
        found = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError:
        # A store out of reach: what reads the tables next fails, naming it. Building Dagster's
        # definitions must not, or every queue's cycles would stop with it.
        return 0
    beyond = sorted((int(m.group(1)) for info in found if info.type == pafs.FileType.Directory
                     and (m := _RETRY.fullmatch(info.base_name)) and int(m.group(1)) > cycles), reverse=True)
    for cycle in beyond:
        try:
            table = DeltaTable(lake_path(lake_root, queue, f"retry_{cycle}"), storage_options=storage_options)
        except TableNotFoundError:
            continue
        if table.get_add_actions(flatten=False).num_rows:
            return cycle
    return 0


@dataclass(frozen=True)
class QueueTables:
    lake_root: str
    queue: str
    storage_options: dict[str, str] = field(repr=False)  # credentials: never in a repr
    # The waiting tables the policy names (or the caller gives); `waiting` adds a draining one.
    policy_waiting: tuple[str, ...]
    lease_settings: LeaseSettings = LeaseSettings()
    # Set by `of`: the policy's retry cycles, beyond which a retry subqueue may still drain.
    policy_cycles: int | None = None

    @classmethod
    def of(cls, declaration: Declaration, queue: str) -> QueueTables:
        policy = declaration.queue(queue).policy
        return cls(
            lake_root=declaration.lake_root.rstrip("/"),
            queue=queue,
            storage_options=dict(declaration.storage_options),
            policy_waiting=tuple(waiting_tables(policy)),
            lease_settings=declaration.lease,
            policy_cycles=policy.max_retry_cycles,
        )

    @cached_property
    def waiting(self) -> tuple[str, ...]:
        """The queue's waiting tables: the policy's, and through a retry subqueue beyond them that
        still holds messages (routing.waiting_tables). Listed at the first use, not when built: most
        readers of a queue's tables (a sensor's look at its events, a lease) never ask."""
        if self.policy_cycles is None:
            return self.policy_waiting
        draining = draining_retry(self.lake_root, self.queue, self.storage_options, self.policy_cycles)
        return self.policy_waiting if draining <= self.policy_cycles else tuple(tables_through(draining))

    @property
    def last_retry(self) -> int:
        """The last retry subqueue of `waiting` (0: none), the policy's or one still draining."""
        return sum(table.startswith("retry_") for table in self.waiting)

    @property
    def all_tables(self) -> tuple[str, ...]:
        return (*self.waiting, DEAD_LETTER, QUARANTINE, PROCESSED, ATTEMPTS, EVENTS, NOTIFICATIONS,
                CONVERSATIONS, TRANSMISSION, ACTIONS, EDITS, PURGED, ARCHIVED, JOURNAL, PLANS)

    def __post_init__(self) -> None:
        segment(self.queue, "queue name")

    def uri(self, table: str) -> str:
        return lake_path(self.lake_root, self.queue, table)

    def work_uri(self, *parts: str) -> str:
        """Where the cycle journal and staged results live, beside the tables."""
        return lake_path(self.lake_root, self.queue, "_work", *parts)

    def lease_holder(self) -> Holder | None:
        """Who holds the queue's lease now, if anyone."""
        return current_holder(self.uri(LEASE_TABLE), self.storage_options)

    def ensure(self) -> None:
        """Create every table that does not exist yet (safe to call from several processes). Once
        they all exist, a note beside them says so, and later calls read that one small file instead
        of asking each table (two requests each on an object store). A table deleted by hand after
        that is not made again empty: opening it fails, naming it."""
        note = self.work_uri("tables.json")
        fs, path = fs_of(note, self.storage_options)
        try:
            with fs.open_input_stream(path) as stream:
                if set(json.loads(stream.read())) >= set(self.all_tables):
                    return
        except (FileNotFoundError, ValueError):
            pass  # not noted yet, or a note of fewer tables (an older version): ask each table
        for table in self.all_tables:
            if DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options):
                continue
            try:
                with writing("creating a table", self.describe(table)):
                    DeltaTable.create(
                        self.uri(table),
                        schema=schema_of(table),
                        partition_by=schemas.PARTITIONS.get(table),
                        configuration=schemas.CONFIGURATION.get(table),
                        mode="ignore",
                        storage_options=self.storage_options,
                    )
            except Exception:
                if not DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options):
                    raise
        with writing("noting that the queue's tables exist", note), whole_in(fs, path) as stream:
            stream.write(json.dumps(sorted(self.all_tables)).encode())

    def open_created(self, table: str) -> DeltaTable:
        """Open `table`; when it is missing (a first use, or the queue's folder deleted), create every
        table of the queue first. Unlike `ensure`, this costs nothing more than the open once they exist."""
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
                "are created by its first enqueue or cycle, and one deleted after that is not made "
                "again empty (restore it, or delete the queue's whole folder to start the queue afresh)"
            ) from None

    def open_if_exists(self, table: str) -> DeltaTable | None:
        """`table` opened, or None while it does not exist: one load, where asking first costs
        another (two requests on an object store)."""
        try:
            return self.open(table)
        except FileNotFoundError:
            return None

    def message_rows(self, table: str, message_id: str) -> list[dict[str, Any]]:
        """Every row of `message_id` in `table` (none when the table does not exist yet)."""
        if not self.exists(table):
            return []
        return self.open(table).to_pyarrow_dataset().to_table(
            filter=pads.field("message_id") == message_id).to_pylist()

    def exists(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), storage_options=self.storage_options)

    def log_mark(self, table: str, version: int | None) -> str | None:
        """`version` of `table` as its log entry shows it (the version, the entry's size and time of
        writing), for `unchanged_since`; None for a table that does not exist. A table deleted and
        made again has other entries, so another mark."""
        if version is None:
            return None
        fs, (path,) = fs_of_all([self._log_entry(table, version)], self.storage_options)
        return _mark(version, fs.get_file_info(path))

    def unchanged_since(self, table: str, mark: str | None) -> bool:
        """Whether `table` is still as `log_mark` saw it, asked of the two log entries that say so:
        the next one, absent, and the marked one, the same. Three requests on an object store
        whatever the table's history, where loading the table reads its last checkpoint and every
        commit since."""
        version = -1 if mark is None else int(mark.split("/", 1)[0])
        fs, paths = fs_of_all([self._log_entry(table, v) for v in (version + 1, version)], self.storage_options)
        if not absent(fs, paths[:1])[0]:
            return False
        return mark is None or _mark(version, fs.get_file_info(paths[1])) == mark

    def _log_entry(self, table: str, version: int) -> str:
        return f"{self.uri(table)}/_delta_log/{version:020d}.json"

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

    def stats(self, table: str, now: datetime, *, snapshot: DeltaTable | None = None,
              limit_rows: int | None = None) -> TableStats:
        """Rows, oldest entry and due batches of a table, from the Delta log's file statistics (and
        the batch ids of the few files that a rewrite left holding several batches). `snapshot`:
        the table as the caller holds it (a writer's `latest`), else it is loaded. `limit_rows`:
        only the oldest due batches (in log order), whole, until they hold that many rows (a probe)."""
        target = snapshot if snapshot is not None else self.open(table)
        actions = pa.table(target.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return TableStats(target.version(), 0, 0, None, 0, (), (), None)
        rows = actions["num_records"].combine_chunks()
        oldest_col = f"min.{_ARRIVAL.get(table, 'entered_at')}"
        oldest = pc.min(actions[oldest_col]).as_py() if oldest_col in actions.column_names else None
        due_rows, next_due = 0, None
        due_files: tuple[str, ...] = ()
        due_batches: tuple[str, ...] = ()
        null_columns: tuple[str, ...] = ()
        due_sizes: tuple[int, ...] = ()
        if "max.due_at" in actions.column_names:
            dues = actions["max.due_at"].combine_chunks()
            due = pc.fill_null(pc.less_equal(dues, pa.scalar(now).cast(dues.type)), False).to_numpy(
                zero_copy_only=False)
            files, batches = self._batches_of_files(target, actions)
            taken = _whole_due_files(due, files, batches)
            if limit_rows is not None:
                taken = _first_batches(taken, files, batches, rows.to_numpy(zero_copy_only=False), limit_rows)
            picked = pa.array(taken)
            due_rows = pc.sum(rows.filter(picked)).as_py() or 0
            root = self.uri(table)
            due_files = tuple(f"{root}/{p}" for p in actions["path"].combine_chunks().filter(picked).to_pylist())
            due_batches = tuple(pc.unique(batches.filter(pa.array(taken[files]))).sort().to_pylist())
            # A due file held back waits for one of those not due yet.
            later = pc.fill_null(pc.greater(dues, pa.scalar(now).cast(dues.type)), False)
            next_due = pc.min(dues.filter(pc.and_(later, pa.array(~taken)))).as_py()
            null_columns = _null_columns(actions.filter(picked))
            due_sizes = tuple(actions["size_bytes"].combine_chunks().filter(picked).to_pylist())
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
            due_sizes=due_sizes,
        )
