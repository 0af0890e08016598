"""Committing a staged cycle to the Delta tables, each commit at most once.

Every append carries the Delta app transaction (queue/table, cycle seq) so a replay skips what is
already committed; the source batches are removed last, by a delete that a replay makes a no-op.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED, QUARANTINE, STAY, Disposition
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import QUEUE_DISABLED, event_row
from poison_pipeline.storage.journal import JournalEntry
from poison_pipeline.storage.tables import ATTEMPTS, EVENTS, NOTIFICATIONS, QueueTables


def _staged(entry: JournalEntry) -> pads.Dataset:
    return pads.dataset(entry.staging, format="parquet")


def _with(rows: pa.Table, schema: pa.Schema, **constants: object) -> pa.Table:
    """Project `rows` onto `schema`, filling the named columns with constants."""
    columns = []
    for field in schema:
        if field.name in constants:
            columns.append(pa.array([constants[field.name]] * rows.num_rows, type=field.type))
        else:
            columns.append(rows.column(field.name).cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _attempt_rows(staged: pads.Dataset, entry: JournalEntry, cycle: int, now: datetime) -> pa.Table:
    table = staged.to_table(columns=["message_id", "attempts"])
    flat = pc.list_flatten(table["attempts"])
    parents = pc.list_parent_indices(table["attempts"])
    ids = pc.take(table["message_id"], parents)
    attempts = pa.Table.from_struct_array(flat) if len(flat) else None
    columns: dict[str, pa.Array] = {"message_id": ids}
    for field in schemas.ATTEMPT_FIELDS:
        columns[field.name] = attempts.column(field.name) if attempts else pa.array([], field.type)
    built = pa.table(columns)
    return _with(built, schemas.ATTEMPTS, table=entry.table, cycle=cycle, run_id=entry.run_id,
                 cycle_seq=entry.seq, date=now.date().isoformat())


def apply_staged(tables: QueueTables, entry: JournalEntry, cycle: int) -> dict[str, float]:
    """Commit a staged cycle; return the counts per disposition and of attempts."""
    now = datetime.fromisoformat(entry.started_at)
    staged = _staged(entry)
    app_id = f"poison_pipeline/{tables.queue}/{entry.table}"

    def commit(table: str, data: pa.Table) -> None:
        if data.num_rows:
            tables.append(table, data, app_id=app_id, version=entry.seq)

    attempts = _attempt_rows(staged, entry, cycle, now)
    commit(ATTEMPTS, attempts)
    summary = staged.to_table(columns=["destination", "disposition", "sender", "message_id"])
    destinations = set(summary["destination"].to_pylist())
    for destination in sorted(destinations):
        rows = staged.to_table(filter=pc.field("destination") == destination)
        if destination == PROCESSED:
            commit(PROCESSED, _with(rows, schemas.PROCESSED, from_table=entry.table, at=now,
                                    date=now.date().isoformat(), cycle_seq=entry.seq))
        elif destination == DEAD_LETTER:
            commit(DEAD_LETTER, _with(rows, schemas.DEAD_LETTER, from_table=entry.table,
                                      dead_lettered_at=now))
        elif destination == QUARANTINE:
            commit(QUARANTINE, _with(rows, schemas.QUARANTINE, from_table=entry.table,
                                     quarantined_at=now))
        else:
            commit(entry.table if destination == STAY else destination, _with(rows, schemas.MESSAGE))
    commit(NOTIFICATIONS, _negative_acknowledgements(staged, entry, now))
    commit(EVENTS, _fault_events(summary, entry, now))
    tables.remove_batches(entry.table, entry.batches)
    counts: dict[str, float] = dict(Counter(summary["disposition"].to_pylist()))
    counts["messages"] = summary.num_rows
    counts["attempts"] = attempts.num_rows
    return counts


def _negative_acknowledgements(staged: pads.Dataset, entry: JournalEntry, now: datetime) -> pa.Table:
    rejected = staged.to_table(
        columns=["message_id", "conversation_id", "sender", "total_abort_count", "last_error_type"],
        filter=(pc.field("disposition") == Disposition.REJECTED.value) & pc.field("sender").is_valid(),
    ).to_pylist()
    rows = [
        {
            "notification_id": f"nack-{entry.table}-{entry.seq}-{r['message_id']}",
            "recipient": r["sender"],
            "kind": "negative_acknowledgement",
            "message_id": r["message_id"],
            "conversation_id": r["conversation_id"],
            "code": None,
            "description": (
                f"rejected after {r['total_abort_count']} failed attempts"
                + (f"; last error {r['last_error_type']}" if r["last_error_type"] else "")
            ),
            "at": now,
        }
        for r in rejected
    ]
    return pa.Table.from_pylist(rows, schema=schemas.NOTIFICATIONS)


def _fault_events(summary: pa.Table, entry: JournalEntry, now: datetime) -> pa.Table:
    faulted = summary.filter(pc.equal(summary["disposition"], Disposition.FAULTED.value))
    rows = [
        event_row(QUEUE_DISABLED, now, "poison_pipeline",
                  f"message {message_id} faulted after its last retry cycle "
                  "(receive_error_handling: fault)", message_id, entry.table)
        for message_id in faulted["message_id"].to_pylist()
    ]
    return pa.Table.from_pylist(rows, schema=schemas.EVENTS)
