"""Who may commit to a queue's tables, visible in the code: a `QueueWriter`, handed out with the
queue's lease and fenced by its epoch, makes every commit of a cycle or an operator command; a
`LeaseFreeAppender` makes the only commits that need no lease (an enqueue's, a transmission's or a
redrive's append to a queue's inbound, and the intake rows that count them).

The fence: every commit of a writer carries the Delta app transaction `poison_pipeline/<queue>/fence`
at the lease's epoch. A writer refuses to commit from a snapshot that shows a newer epoch, and a
commit whose snapshot predates a newer epoch's commit fails in Delta's conflict checker (a commit
that sets an app transaction conflicts with every commit that set the same one since its snapshot).
A starter that takes a lease over from a holder that stopped renewing first commits its epoch to
every table of the queue (`fence_all`), so the old holder's commits are refused wherever it paused;
a lease released cleanly needs no fence (its holder made its last commit before releasing it).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.storage import schemas
from poison_pipeline.storage.faults import writing
from poison_pipeline.storage.files import files_dataset, log_names
from poison_pipeline.storage.lease import LEASE_TABLE, Holder, Lease, LeaseLost, queue_lease
from poison_pipeline.storage.tables import (
    INTAKE,
    WRITER,
    QueueTables,
    schema_of,
    whole_file_removes,
)

__all__ = ["Committer", "Fenced", "LeaseFreeAppender", "QueueWriter", "fence_app", "queue_writer", "queue_writers"]

# An enqueue's append and a cycle's delete of the batches it took touch different files, yet delta-rs
# may refuse one of two such commits made at once ("a concurrent transaction deleted data this
# operation read"). Both are safe to make again on the newer table: a refused commit wrote nothing,
# an append with an app id is made once only, and deleting a deleted batch changes nothing. A commit
# refused by the fence is never made again: the retry's own check finds the newer epoch.
_COMMIT_TRIES = 8
T = TypeVar("T")


class Fenced(LeaseLost):
    """The storage refused a commit: a newer holder of the queue's lease has fenced this one out."""


def fence_app(queue: str) -> str:
    return f"poison_pipeline/{queue}/fence"


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


class Committer:
    """Commits to the tables of one queue, each carrying `fence` when there is one.

    A committer keeps its own snapshot of each table it commits to and brings it up to date before
    each use (`latest`): loading a table lists its log and reads every commit since its last
    checkpoint, several times (dozens of requests on an object store), where bringing a snapshot up
    to date reads only the commits made since. The snapshots are the committer's alone: a caller
    that must commit from the version it read opens a table of its own (`QueueTables.open`)."""

    def __init__(self, tables: QueueTables, fence: Transaction | None) -> None:
        self.tables = tables
        self._fence = fence
        self._snapshots: dict[str, DeltaTable] = {}
        # The version of each kept snapshot up to which no newer epoch is recorded: reading a table's
        # app transactions reads its whole log again, so it is read once per version the table reaches.
        self._admitted: dict[str, int] = {}

    def check(self) -> None:
        """Before a commit: stop one whose writer knows it may not commit any more (the storage
        refuses it anyway; this only spares the work of making it)."""

    def latest(self, table: str) -> DeltaTable:
        """`table` as it is now, from this committer's kept snapshot (loaded at its first use). Always
        brought up to date, even just after `prefetch`: the holder's own work commits through other
        snapshots too (an undo's restore, a redrive's append), and a read from a snapshot that
        missed one would select what was already moved."""
        kept = self._snapshots.get(table)
        if kept is not None:
            try:
                kept.update_incremental()
                return kept
            except Exception:  # noqa: BLE001 - a log cleaned up under it, say: load it again
                self._admitted.pop(table, None)
        kept = self._snapshots[table] = self.tables.open(table)
        return kept

    def prefetch(self, names: Iterable[str]) -> None:
        """Load at once the snapshots of `names` not kept yet (those that exist): a load is a
        series of requests each waiting for the last, so on an object store loading tables one after
        the other adds up their latencies."""
        missing = [name for name in dict.fromkeys(names) if name not in self._snapshots]
        if len(missing) < 2:
            return
        with ThreadPoolExecutor(min(8, len(missing)), thread_name_prefix="prefetch") as pool:
            loaded = list(pool.map(self.tables.open_if_exists, missing))
        for name, snapshot in zip(missing, loaded, strict=True):
            if snapshot is not None:
                self._snapshots[name] = snapshot

    def latest_if_exists(self, table: str) -> DeltaTable | None:
        """`latest`, or None while `table` does not exist."""
        try:
            return self.latest(table)
        except FileNotFoundError:
            return None

    def _admit(self, target: DeltaTable, table: str) -> list[Transaction]:
        """The fence's transaction for a commit from `target`, refusing a snapshot that shows a newer one."""
        if self._fence is None:
            return []
        kept = self._snapshots.get(table) is target
        if kept and self._admitted.get(table) == target.version():
            return [self._fence]
        seen = target.transaction_version(self._fence.app_id)
        if seen is not None and seen > self._fence.version:
            raise Fenced(f"the lease of queue {self.tables.queue!r} was taken over (epoch {seen}, this holder's "
                         f"{self._fence.version}): {self.tables.describe(table)} refuses this holder's commits")
        if kept:
            self._admitted[table] = target.version()
        return [self._fence]

    def _committed(self, table: str, target: DeltaTable, before: int) -> None:
        """After a commit from `target` read at version `before`: when the table now stands at the
        very next version, that commit is this committer's own, and no newer epoch came with it."""
        if self._snapshots.get(table) is target and self._admitted.get(table) == before \
                and target.version() == before + 1:
            self._admitted[table] = before + 1

    def _refused(self, table: str) -> None:
        """After delta-rs refused a commit: raise Fenced when a newer epoch is why (the table as it
        is now, whatever snapshot the commit was made from: loaded afresh, a refusal being rare)."""
        self._admit(DeltaTable(self.tables.uri(table), storage_options=self.tables.storage_options), table)

    def properties(self, target: DeltaTable, table: str, transactions: Sequence[Transaction] = (),
                   metadata: dict[str, str] | None = None) -> CommitProperties | None:
        """The commit properties of a commit to `table` from `target`: its app transactions and the fence."""
        fenced = [*transactions, *self._admit(target, table)]
        return CommitProperties(app_transactions=fenced, custom_metadata=metadata) if fenced or metadata else None

    def append(self, table: str, data: Any, app_id: str | None = None, version: int = 0,
               also: Sequence[Transaction] = (), metadata: dict[str, str] | None = None,
               snapshot: DeltaTable | None = None, on_commit: Callable[[int], None] | None = None) -> bool:
        """Append `data`; with an app id, once only: a replay of a committed version writes nothing.
        `also` are further app transactions recorded by the same commit, `metadata` goes into its
        commit info (the log's history shows it). `snapshot`: the table as the caller just opened it
        (loading a long log again costs milliseconds). `on_commit` is called with the version committed."""
        tables = self.tables

        def once(attempt: int) -> bool:
            self.check()
            target = snapshot if snapshot is not None and attempt == 0 else self.latest(table)
            before = target.version()
            transactions = list(also)
            if app_id is not None:
                # `or -1` would read a committed version 0 as "never committed".
                committed = target.transaction_version(app_id)
                if committed is not None and committed >= version:
                    return False
                transactions.append(Transaction(app_id, version))
            properties = self.properties(target, table, transactions, metadata)
            try:
                with writing("appending to a table", tables.describe(table)):
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
            except CommitFailedError:
                self._refused(table)
                raise
            self._committed(table, target, before)
            if on_commit is not None:
                on_commit(target.version())
            return True

        # A stream is read once by the write: only a table can be written again.
        return _again_on_conflict(once, 1 if isinstance(data, pa.RecordBatchReader) else _COMMIT_TRIES)


class LeaseFreeAppender(Committer):
    """The appends that need no lease: to a queue's inbound and its intake ledger (what enqueues,
    transmissions and redrives from another queue write), concurrent with the queue's holder."""

    def __init__(self, tables: QueueTables) -> None:
        super().__init__(tables, None)

    def append(self, table: str, data: Any, app_id: str | None = None, version: int = 0,
               also: Sequence[Transaction] = (), metadata: dict[str, str] | None = None,
               snapshot: DeltaTable | None = None, on_commit: Callable[[int], None] | None = None) -> bool:
        if table not in (INBOUND, INTAKE):
            raise ValueError(f"{self.tables.describe(table)}: only a queue's inbound and intake take appends "
                             "without its lease")
        return super().append(table, data, app_id, version, also, metadata, snapshot, on_commit)


class QueueWriter(Committer):
    """Every commit of the holder of a queue's lease, fenced by the lease's epoch."""

    def __init__(self, tables: QueueTables, lease: Lease, holding: dict[str, QueueWriter] | None = None) -> None:
        super().__init__(tables, Transaction(fence_app(tables.queue), lease.epoch))
        self.lease = lease
        # The writers held together with this one (its own included), by lease: work that holds one
        # hands it down (`queue_writer(within=...)`), so a call it makes on a queue it holds gets that
        # writer instead of waiting for itself, and a writer taken under it joins the holding.
        self.holding = {} if holding is None else holding
        # The interrupted work of the queue (cycles left staged, operator actions left planned) is
        # completed once per holding, before the holder's own work: `settled` once begun, and the
        # ids of the actions completed then (a command's report lists them).
        self.settled = False
        self.completed_actions: list[str] = []

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    def check(self) -> None:
        """Raise LeaseLost when this holder knows it lost the lease (the fence stops it anyway)."""
        self.lease.check()

    def fence_all(self) -> None:
        """Commit this epoch to every table of the queue (an empty commit each), so that a holder
        this one took the lease from can commit to none of them any more."""
        self.tables.ensure()
        names = [*self.tables.all_tables, *((INTAKE,) if self.tables.exists(INTAKE) else ())]
        for table in names:
            def once(attempt: int, table: str = table) -> None:
                target = self.latest(table)
                before = target.version()
                with writing("fencing out the lease's previous holder", self.tables.describe(table)):
                    target.create_write_transaction([], "append", target.schema(),
                                                    commit_properties=self.properties(target, table))
                target.update_incremental()  # a transaction leaves its snapshot where it was
                self._committed(table, target, before)
            _again_on_conflict(once)

    def remove_batches(self, table: str, batch_ids: Iterable[str]) -> None:
        """Delete whole batches; deleting an already deleted batch changes nothing."""
        ids = sorted(set(batch_ids))
        if not ids:
            return
        self.check()
        tables = self.tables
        quoted = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)

        def once(attempt: int) -> None:
            target = self.latest(table)
            before = target.version()
            try:
                with writing("deleting taken batches from a table", tables.describe(table)):
                    removes = None if schemas.PARTITIONS.get(table) else whole_file_removes(
                        target, pa.array(ids, pa.string()), lambda paths: _batch_ids_of(tables, table, paths))
                    if removes is None:
                        target.delete(f"batch_id IN ({quoted})", commit_properties=self.properties(target, table))
                    elif removes:
                        # The log's history shows it as an append (delta-rs names no other operation here).
                        noted = self.properties(target, table,
                                                metadata={"poison_pipeline.removed_batches": str(len(ids))})
                        target.create_write_transaction(removes, "append", target.schema(), commit_properties=noted)
                        target.update_incremental()  # a transaction leaves its snapshot where it was
            except CommitFailedError:
                self._refused(table)
                raise
            self._committed(table, target, before)

        _again_on_conflict(once)

    def replace_batches(self, table: str, batch_ids: Iterable[str | None], keep: pads.Expression,
                        snapshot: DeltaTable | None = None, add: pa.Table | None = None,
                        also: Sequence[Transaction] = ()) -> None:
        """Rewrite whole batches in one commit, keeping only their rows that match `keep`.

        delta-rs's delete writes a partly deleted file back with string_view columns, which pyarrow
        cannot filter on (delta-rs issue 4579): a later filtered read of the table would fail. The
        kept rows are streamed and written here instead, as plain strings, and a batch still sits
        in files of its own; `add` rows are written in the same commit. Given the `snapshot` the
        caller read the batches from, the commit fails if another one removed them since (a cycle
        that took them) instead of silently doing nothing. `also` are app transactions the commit
        records (a replay of an operator action reads from them that this rewrite was made).
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
        self.check()
        target = snapshot if snapshot is not None else self.tables.open(table)
        properties = self.properties(target, table, also)
        kept: Any = target.to_pyarrow_dataset().scanner(filter=within & keep).to_reader()
        if add is not None:
            # Rows added in the same commit must carry one of the batch ids, or the overwrite refuses them.
            kept = pa.concat_tables([kept.read_all().cast(schema_of(table)), add.cast(schema_of(table))])
        try:
            with writing("rewriting batches of a table", self.tables.describe(table)):
                write_deltalake(target, kept, mode="overwrite", predicate=" OR ".join(clauses),
                                writer_properties=WRITER, commit_properties=properties)
        except CommitFailedError:
            self._refused(table)
            raise

    def overwrite_where(self, table: str, rows: pa.Table, predicate: str, doing: str,
                        schema_mode: Literal["merge", "overwrite"] | None = None) -> None:
        """Replace the rows matching `predicate` (SQL over the table's own columns, built by the
        caller from quoted values) with `rows`, in one commit."""
        self.check()
        target = self.latest(table)
        before = target.version()
        properties = self.properties(target, table)
        try:
            with writing(doing, self.tables.describe(table)):
                write_deltalake(target, rows, mode="overwrite", predicate=predicate, commit_properties=properties,
                                schema_mode=schema_mode)
        except CommitFailedError:
            self._refused(table)
            raise
        self._committed(table, target, before)

    def restore(self, table: str, version: int, snapshot: DeltaTable, also: Sequence[Transaction] = ()) -> None:
        """Restore `table` to `version` from `snapshot` (refused if another commit came since it);
        `also` are app transactions the restore commit records."""
        self.check()
        properties = self.properties(snapshot, table, also)
        try:
            with writing(f"restoring version {version}", self.tables.describe(table)):
                snapshot.restore(version, commit_properties=properties)
        except CommitFailedError:
            self._refused(table)
            raise


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _batch_ids_of(tables: QueueTables, table: str, paths: list[str]) -> pa.Table:
    """The batch id of every row of the files `paths` (as the log names them), and its file's
    index in `paths`."""
    rows = files_dataset(tables.uri(table), tables.storage_options, paths, None, schema_of(table)).to_table(
        columns=["batch_id", "__filename"])
    names = pc.unique(rows["__filename"])
    where = {path: i for i, path in enumerate(paths)}
    index = pa.array([where[name] for name in log_names(names.to_pylist(), paths)], pa.int64())
    return pa.table({"batch_id": rows["batch_id"],
                     "file": pc.take(index, pc.index_in(rows["__filename"], value_set=names))})


@contextmanager
def queue_writer(tables: QueueTables, purpose: str, run_id: str = "manual",
                 on_wait: Callable[[Holder], None] | None = None, *,
                 within: QueueWriter | None = None) -> Iterator[QueueWriter]:
    """Hold the queue's lease for the block and hand out its writer. `within`: a writer the caller
    holds; when it or one held with it is this queue's, the block gets that writer (a cycle ends a
    conversation or transmits on its own queue without waiting for itself). Taking the lease over
    from a holder that stopped renewing fences it out of every table first."""
    key = tables.uri(LEASE_TABLE)
    holding = {} if within is None else within.holding
    if key in holding:
        yield holding[key]
        return
    with queue_lease(key, tables.queue, tables.storage_options, tables.lease_settings, purpose, run_id,
                     on_wait) as lease:
        writer = QueueWriter(tables, lease, holding)
        if lease.took_over:
            writer.fence_all()
        holding[key] = writer
        try:
            yield writer
        finally:
            del holding[key]


@contextmanager
def queue_writers(all_tables: Sequence[QueueTables], purpose: str, run_id: str = "manual", *,
                  within: QueueWriter | None = None) -> Iterator[QueueWriter]:
    """Hold the leases of several queues, taken in one order (by queue name) by every holder that
    takes more than one: two of them that need the same queues never wait on each other. Yields the
    writer of the first; the others are in its holding, so `queue_writer(within=...)` finds them. A
    caller that holds one of them already (`within`) takes the others after it."""
    by_lease = {tables.uri(LEASE_TABLE): tables for tables in all_tables}
    ordered = sorted(by_lease.values(), key=lambda tables: (tables.queue, tables.uri(LEASE_TABLE)))
    with ExitStack() as stack:
        taken: list[QueueWriter] = []
        for tables in ordered:
            taken.append(stack.enter_context(queue_writer(tables, purpose, run_id,
                                                          within=taken[-1] if taken else within)))
        yield taken[0]
