"""The intake ledger: how many messages ever entered a queue, for the conservation check.

Every way a message enters a queue's tables from outside writes one row here after its data commit,
under the same Delta app transaction when it has one, so a replay counts it once: an enqueue, a
delivery from another queue's transmission, a send dead-lettered in its sender (it never left), a
redrive to another queue (negative in the queue it left). Moves within a queue write nothing.

A lake made before the ledger existed gets it on the first such write (or check) with an opening
balance: every row in its places and terminal ledgers at that moment, under one app transaction.
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND, PROCESSED, QUARANTINE
from poison_pipeline.storage import schemas
from poison_pipeline.storage.journal import list_files, read_json, remove_file, write_json
from poison_pipeline.storage.message_ids import note_appended_ids
from poison_pipeline.storage.tables import INTAKE, PURGED, QueueTables
from poison_pipeline.storage.writer import Committer, LeaseFreeAppender

ENQUEUE = "enqueue"
UNSENT = "unsent"
OPENING = "opening balance"
_OPENING_APP_ID = "poison_pipeline/intake/opening"


def accounted_rows(tables: QueueTables) -> int:
    """Rows in the queue's places and terminal ledgers, from the Delta logs alone."""
    places = (*tables.waiting, DEAD_LETTER, QUARANTINE, PROCESSED, PURGED)
    return sum(tables.open(table).count() for table in places if tables.exists(table))


def ensure_intake(committer: Committer, now: datetime | None = None) -> None:
    """Create the intake ledger if missing; call before the data commit of what it will record."""
    tables = committer.tables
    if tables.exists(INTAKE):
        return
    try:
        DeltaTable.create(tables.uri(INTAKE), schema=schemas.INTAKE, mode="ignore",
                          storage_options=tables.storage_options)
    except Exception:
        if not tables.exists(INTAKE):
            raise
    opening = accounted_rows(tables)
    if opening:
        record_intake(committer, OPENING, OPENING, opening, now, app_id=_OPENING_APP_ID, version=1)


def opened_intake(committer: Committer, now: datetime | None = None) -> DeltaTable:
    """The intake ledger, opened (an append needs it open anyway); created first if missing."""
    try:
        return committer.tables.open(INTAKE)
    except FileNotFoundError:
        ensure_intake(committer, now)
        return committer.tables.open(INTAKE)


def record_intake(committer: Committer, source: str, batch_id: str | None, messages: int,
                  now: datetime | None = None, app_id: str | None = None, version: int = 0,
                  snapshot: DeltaTable | None = None) -> None:
    """One intake row; with an app id, written once whatever the replays (the data's own app id).
    `snapshot`: the ledger as `opened_intake` gave it (then it is known to exist)."""
    if messages == 0:
        return
    if snapshot is None:
        ensure_intake(committer, now)
    row = {"batch_id": batch_id, "source": source, "messages": messages, "at": now or datetime.now(UTC)}
    committer.append(INTAKE, pa.Table.from_pylist([row], schema=schemas.INTAKE),
                  app_id=None if app_id is None else f"{app_id}/intake", version=version, snapshot=snapshot)


def accepted_total(tables: QueueTables) -> int | None:
    """Messages ever accepted (None without a ledger), from the log: each append writes one file of
    one row whose statistics hold its count; only files a compaction merged are read."""
    if not tables.exists(INTAKE):
        return None
    target = tables.open(INTAKE)
    actions = pa.table(target.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    rows = actions.column("num_records").to_pylist()
    paths = actions.column("path").to_pylist()
    counts = actions.column("min.messages").to_pylist() if "min.messages" in actions.column_names \
        else [None] * len(rows)
    total, merged = 0, []
    for path, n, count in zip(paths, rows, counts, strict=True):
        if n == 1 and count is not None:
            total += count
        elif n:
            merged.append(path)
    if merged:
        fragments = [f for f in target.to_pyarrow_dataset().get_fragments() if f.path in set(merged)]
        total += sum(pc.sum(f.to_table(columns=["messages"])["messages"]).as_py() or 0 for f in fragments)
    return total


# An enqueue makes two commits, its batch to inbound and then its intake row. A note written before
# the first and removed after the second lets the next enqueue or cycle of the queue record the row
# of a batch whose enqueue failed between the two (a full disk, a read-only intake table, a kill).
_NOTES = "intake"
_BATCH_KEY = "poison_pipeline.batch_id"
# A note of another host's enqueue is settled only once that enqueue has surely ended.
_OTHER_HOST_AFTER = timedelta(minutes=10)
_in_flight: set[str] = set()


def _note_uri(tables: QueueTables, batch_id: str) -> str:
    return tables.work_uri(_NOTES, f"{batch_id}.json")


def append_enqueued(tables: QueueTables, rows: pa.Table, batch_id: str, now: datetime,
                    inbound: DeltaTable | None = None, intake: DeltaTable | None = None) -> None:
    """Append an enqueued batch to inbound and record its intake, so that a failure between the two
    commits is repaired by `settle_intake` instead of leaving the conservation check failing.
    `inbound`, `intake`: the tables as the caller just opened them."""
    uri = _note_uri(tables, batch_id)
    inbound = inbound if inbound is not None else tables.open(INBOUND)
    appender = LeaseFreeAppender(tables)
    note = {"batch_id": batch_id, "messages": rows.num_rows, "at": now.isoformat(), "after": inbound.version(),
            "host": socket.gethostname(), "pid": os.getpid(), "written": datetime.now(UTC).isoformat()}
    write_json(uri, tables.storage_options, note, "noting an enqueue until its intake is recorded")
    _in_flight.add(batch_id)
    try:
        appender.append(INBOUND, rows, metadata={_BATCH_KEY: batch_id}, snapshot=inbound)
        note_appended_ids(tables, INBOUND, inbound, note["after"], _BATCH_KEY, batch_id, rows["message_id"])
        record_intake(appender, ENQUEUE, batch_id, rows.num_rows, now, snapshot=intake)
    finally:
        _in_flight.discard(batch_id)
    # Both commits are made: a note left behind is found counted and removed by the next settle.
    with contextlib.suppress(OSError):
        remove_file(uri, tables.storage_options)


def settle_intake(committer: Committer) -> list[str]:
    """Record the intake row of each batch whose enqueue committed it to inbound and then failed to
    record it; forget the notes of enqueues that committed nothing. Returns the batches recorded."""
    tables = committer.tables
    recorded = []
    for uri in list_files(tables.work_uri(_NOTES), tables.storage_options):
        note = read_json(uri, tables.storage_options)
        if note is None or _in_flight_elsewhere(note):
            continue
        batch_id = str(note["batch_id"])
        if _landed(tables, batch_id, int(note["after"])) and not _counted(tables, batch_id):
            record_intake(committer, ENQUEUE, batch_id, int(note["messages"]), datetime.fromisoformat(note["at"]))
            recorded.append(batch_id)
        remove_file(uri, tables.storage_options)
    return recorded


def _in_flight_elsewhere(note: dict[str, Any]) -> bool:
    """Whether the enqueue that wrote `note` may still be between its commits: on this host, while
    its process lives (or, in this process, its call runs); on another, for a while after it wrote."""
    if note["host"] != socket.gethostname():
        return datetime.now(UTC) - datetime.fromisoformat(note["written"]) < _OTHER_HOST_AFTER
    if note["pid"] == os.getpid():
        return note["batch_id"] in _in_flight
    try:
        os.kill(int(note["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _landed(tables: QueueTables, batch_id: str, after: int) -> bool:
    """Whether inbound's log has the batch's commit (its commit info names it)."""
    if not tables.exists(INBOUND):
        return False
    target = tables.open(INBOUND)
    newer = target.version() - after
    return newer > 0 and any(entry.get(_BATCH_KEY) == batch_id for entry in target.history(newer))


def _counted(tables: QueueTables, batch_id: str) -> bool:
    if not tables.exists(INTAKE):
        return False
    return tables.open(INTAKE).to_pyarrow_dataset().count_rows(filter=pc.field("batch_id") == batch_id) > 0


def enqueued_batch_landed(tables: QueueTables, batch_id: str) -> bool:
    """Whether an enqueue's batch reached inbound, by its note (None-safe: False without one)."""
    note = read_json(_note_uri(tables, batch_id), tables.storage_options)
    return note is not None and _landed(tables, batch_id, int(note["after"]))
