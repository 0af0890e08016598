"""One writer per queue, whatever starts it: a lease kept as a one-row Delta table in the lake.

Taking, renewing and releasing the lease each overwrite that row from the snapshot just read. Two
overwrites from one snapshot conflict in Delta (the later commit fails: it read data the other
removed), so taking the lease is an atomic create-if-absent wherever delta-rs commits are atomic:
a local disk, and every object store delta-rs supports for concurrent writers. That holds only when
the snapshot has a file to remove: two overwrites of an empty table both commit. So the table is
never left empty: it is created, and released, with a row that names no holder.

A lease not renewed for `expiry` is expired. A waiter sees that on its own monotonic clock only
(the row's version has not moved for `expiry` while it watched): no two hosts' clocks need to agree,
and a stamp in the row is never compared with the waiter's clock. The holder renews at a third of
`expiry` from a thread and counts its lease from before each renewal write (the waiter may have seen
the version it replaces from then on).

A lease is not a fence: a holder can pause for any time between a check and a write. Taking the
lease increments its `epoch`; every commit of the holder carries the epoch (storage/writer.py), and
a starter that takes a lease over from a holder that stopped renewing first commits its epoch to
every table of the queue. From then on the storage itself refuses the old holder's commits, wherever
it paused: Delta's conflict checker fails a commit whose app transaction another commit has set
since its snapshot, and a snapshot that already shows a newer epoch is refused before writing.

A lease is not reentrant: storage/writer.py's `queue_writer` is, for the work that hands its writer
down (`within=`): a cycle that holds its queue's lease ends a conversation or transmits on that
queue with the writer it has instead of waiting for itself.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from poison_pipeline.domain.declaration import LeaseSettings
from poison_pipeline.domain.redaction import redact
from poison_pipeline.storage import schemas
from poison_pipeline.storage.faults import writing

LEASE_TABLE = "_lease"
# Renewals add a version each: checkpoints and log clean-up keep reading the lease cheap.
TABLE_CONFIG = {"delta.checkpointInterval": "20", "delta.logRetentionDuration": "interval 1 days"}
_POLL_S = 0.5


@dataclass(frozen=True)
class Holder:
    holder_id: str
    purpose: str
    run_id: str
    host: str
    pid: int
    since: datetime
    renewed_at: datetime
    expires_at: datetime
    epoch: int | None = None  # None in a row written before leases had epochs

    def describe(self) -> str:
        since, renewed = (t.isoformat(timespec="seconds") for t in (self.since, self.renewed_at))
        return (f"run {self.run_id} ({self.purpose}) on host {self.host}, pid {self.pid}, "
                f"holding it since {since}, last renewed {renewed}")


class LeaseHeld(RuntimeError):
    """The queue's lease stayed held by another starter for as long as this one would wait."""

    def __init__(self, queue: str, holder: Holder, waited: timedelta) -> None:
        self.queue, self.holder = queue, holder
        super().__init__(
            f"queue {queue!r} is busy: its lease is held by {holder.describe()}; waited "
            f"{waited.total_seconds():g}s (lease.wait). If that process is dead, its lease expires "
            "once it has gone unrenewed for lease.expiry: start again then, and its work is recovered."
        )


class LeaseLost(RuntimeError):
    """Another starter took this holder's lease over after it went unrenewed for too long."""


@dataclass
class _Seen:
    version: int
    since: float  # this process's monotonic clock when the version was first seen


def _epoch(table: DeltaTable) -> int:
    """The newest epoch the lease table records (released rows keep theirs); 0 before any."""
    rows = table.to_pyarrow_table()
    if "epoch" not in rows.column_names or rows.num_rows == 0:
        return 0
    return max((e for e in rows["epoch"].to_pylist() if e is not None), default=0)


class Lease:
    """The lease of one queue held by this process; use `queue_lease`, which takes and releases it."""

    def __init__(self, uri: str, queue: str, storage_options: dict[str, str], settings: LeaseSettings,
                 purpose: str, run_id: str) -> None:
        self.uri, self.queue, self.storage_options, self.settings = uri, queue, storage_options, settings
        self.holder_id = uuid.uuid4().hex
        self.purpose, self.run_id = purpose, run_id
        self.since = datetime.now(UTC)
        self._lost: str | None = None
        # When the last renewal that held the lease began, on this process's monotonic clock.
        self._renewed = time.monotonic()
        self.epoch = 0
        # Whether this holder took the lease from one that stopped renewing (it must fence it out).
        self.took_over = False
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renew_error: Exception | None = None
        self._table: DeltaTable | None = None

    # -- reading and writing the row -------------------------------------------------------

    def _open(self) -> DeltaTable:
        """The lease table as it is now. The snapshot is kept and brought up to date (the commits
        since, a few requests on an object store) rather than loaded again (the log since its last
        checkpoint, a renewal's commit each): it is this lease's own, read and written by one
        thread at a time (the renewer runs only between `acquire` and `release`)."""
        if self._table is not None:
            try:
                self._table.update_incremental()
            except Exception:  # noqa: BLE001 - a log cleaned up under it, say: load it again
                self._table = None
        if self._table is None:
            self._table = self._load()
        table = self._table
        if not table.file_uris():
            # Released by an older version (no row at all): give the next overwrite a file to
            # remove, or two starters could both take the lease. Two of these writes may both
            # land; they add rows that name no holder, which is harmless.
            with writing(f"writing the lease of queue {self.queue!r}", self.uri):
                write_deltalake(table, _rows(None, 0), mode="append")
        return table

    def _load(self) -> DeltaTable:
        try:  # the lease exists but on a queue's very first use: asking first would cost a load more
            return DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            with writing(f"creating the lease of queue {self.queue!r}", self.uri):
                try:
                    write_deltalake(self.uri, _rows(None, 0), mode="error",
                                    configuration=TABLE_CONFIG, storage_options=self.storage_options)
                except DeltaError:
                    if not DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options):
                        raise  # not a creation race: a real storage problem
            return DeltaTable(self.uri, storage_options=self.storage_options)

    @staticmethod
    def _holder(table: DeltaTable) -> Holder | None:
        rows = [r for r in table.to_pyarrow_table().to_pylist() if r["holder_id"] is not None]
        return Holder(**max(rows, key=lambda r: r["renewed_at"])) if rows else None

    def _row(self) -> dict[str, object]:
        # renewed_at and expires_at are for people reading `status`: no process decides by them.
        now = datetime.now(UTC)
        return {"holder_id": self.holder_id, "purpose": self.purpose, "run_id": self.run_id,
                "host": socket.gethostname(), "pid": os.getpid(), "since": self.since, "renewed_at": now,
                "expires_at": now + self.settings.expiry, "epoch": self.epoch}

    def _write(self, snapshot: DeltaTable, row: dict[str, object] | None) -> bool:
        """Overwrite the row from `snapshot`; False when another commit came first."""
        try:
            with writing(f"writing the lease of queue {self.queue!r}", self.uri):
                # A lease table written before epochs gains the column.
                write_deltalake(snapshot, _rows(row, self.epoch), mode="overwrite", schema_mode="merge")
        except CommitFailedError:
            return False
        return True

    # -- the holder's side -----------------------------------------------------------------

    def acquire(self, on_wait: Callable[[Holder], None] | None = None) -> None:
        """Take the lease, waiting up to `settings.wait` for its holder to release or lose it."""
        started = time.monotonic()
        seen: _Seen | None = None
        told = False
        while True:
            began = time.monotonic()
            table = self._open()
            holder = self._holder(table)
            if holder is None or holder.holder_id == self.holder_id or self._expired(table, seen):
                self.epoch = _epoch(table) + 1
                if self._write(table, self._row()):
                    self._renewed = began
                    self.took_over = holder is not None and holder.holder_id != self.holder_id
                    self._start_renewing()
                    return
                continue  # someone committed between our read and our write: look again
            version = table.version()
            if seen is None or seen.version != version:
                seen = _Seen(version, time.monotonic())
            waited = time.monotonic() - started
            if waited >= self.settings.wait.total_seconds():
                raise LeaseHeld(self.queue, holder, timedelta(seconds=waited))
            if not told:
                (on_wait or _log_wait)(holder)
                told = True
            time.sleep(min(_POLL_S, self.settings.expiry.total_seconds() / 4))

    def _expired(self, table: DeltaTable, seen: _Seen | None) -> bool:
        """Whether this waiter watched the row's version stay unchanged for `expiry` on its own
        clock: a holder's stamps are never trusted, since its clock may run apart from ours."""
        return seen is not None and seen.version == table.version() and \
            time.monotonic() - seen.since >= self.settings.expiry.total_seconds()

    def _start_renewing(self) -> None:
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.queue}", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        interval = self.settings.expiry.total_seconds() / 3
        while not self._stop.wait(interval):
            # A storage hiccup: the next renewal tries again, and check() sees how long it has been.
            try:
                self.renew()
            except Exception as error:
                self._renew_error = error
            if self._lost:
                return

    def renew(self) -> None:
        """Push the expiry forward, or note that the lease was lost."""
        for _ in range(3):
            # Counted from before the write: a waiter may have watched the version it replaces
            # from any moment before it lands.
            began = time.monotonic()
            table = self._open()
            holder = self._holder(table)
            if holder is None or holder.holder_id != self.holder_id:
                self._lost = (f"the lease of queue {self.queue!r} was taken over by "
                              f"{holder.describe() if holder else 'nobody (it was released)'}")
                return
            if self._write(table, self._row()):
                self._renewed = began
                return

    def deadline(self) -> float:
        """Until when (this host's monotonic clock) no waiter can have taken the lease over."""
        return self._renewed + self.settings.expiry.total_seconds()

    def check(self) -> None:
        """Raise LeaseLost if another starter took the lease over: call before committing."""
        unrenewed = time.monotonic() - self._renewed
        if not self._lost and unrenewed >= self.settings.expiry.total_seconds():
            failed = self._renew_error
            why = f" (the last renewal failed: {redact(str(failed))})" if failed is not None else ""
            self._lost = (f"the lease of queue {self.queue!r} could not be renewed for {unrenewed:.1f}s "
                          f"(lease.expiry){why}: another starter may hold it now")
        if self._lost:
            raise LeaseLost(f"{self._lost}: this run ({self.run_id}) stops before committing anything more")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._lost:
            return
        for _ in range(3):
            table = self._open()
            holder = self._holder(table)
            if holder is None or holder.holder_id != self.holder_id or self._write(table, None):
                return


def _rows(row: dict[str, object] | None, epoch: int) -> pa.Table:
    """The lease table's one row: `row`, or a row that names no holder (released) and keeps the epoch."""
    return pa.Table.from_pylist([row or {"holder_id": None, "epoch": epoch}], schema=schemas.LEASE)


def _log_wait(holder: Holder) -> None:
    logging.getLogger(__name__).warning("waiting for the lease of the queue, held by %s", holder.describe())


@contextmanager
def queue_lease(uri: str, queue: str, storage_options: dict[str, str], settings: LeaseSettings, purpose: str,
                run_id: str = "manual", on_wait: Callable[[Holder], None] | None = None) -> Iterator[Lease]:
    """Hold the queue's lease for the block (storage/writer.py's `queue_writer` hands out its writer)."""
    lease = Lease(uri, queue, storage_options, settings, purpose, run_id)
    lease.acquire(on_wait)
    try:
        yield lease
    finally:
        try:
            lease.release()
        except Exception as error:
            # The storage failing under the release must not hide what the holder did or why it
            # failed: the lease, no longer renewed, expires on its own after lease.expiry.
            logging.getLogger(__name__).warning(
                "could not release the lease of queue %r (%s); it expires on its own %s after its "
                "last renewal (lease.expiry)", queue, redact(str(error)), settings.expiry)


@dataclass
class LeaseGuard:
    """What a delivering process (a small cycle's worker, a Spark task) checks before each attempt:
    that the lease its cycle runs under still has the epoch it was given. The lease table is read
    at most every `interval_s` of this process's monotonic clock, so a process resumed from a pause
    of any length reads it before its next attempt: it finishes at most the attempt in flight."""

    uri: str
    queue: str
    storage_options: dict[str, str] = field(repr=False)  # credentials: never in a repr
    epoch: int
    interval_s: float
    _checked: float = float("-inf")

    def check(self) -> None:
        began = time.monotonic()
        if began - self._checked < self.interval_s:
            return
        table = DeltaTable(self.uri, storage_options=self.storage_options)
        current = _epoch(table)
        if current != self.epoch:
            raise LeaseLost(f"the lease of queue {self.queue!r} was taken over (epoch {current}, this cycle's "
                            f"{self.epoch}): this delivery stops before its next attempt")
        self._checked = began

    @classmethod
    def of(cls, lease: Lease) -> LeaseGuard:
        # Often enough that a live holder's tasks notice a takeover within a second.
        interval = min(1.0, lease.settings.expiry.total_seconds() / 10)
        return cls(lease.uri, lease.queue, lease.storage_options, lease.epoch, interval)


def current_holder(uri: str, storage_options: dict[str, str]) -> Holder | None:
    """Who holds the lease now, if anyone (for status); no lease table means nobody ever did."""
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    return Lease._holder(DeltaTable(uri, storage_options=storage_options))
