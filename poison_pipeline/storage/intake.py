"""The intake ledger: how many messages ever entered a queue, for the conservation check.

Every way a message enters a queue's tables from outside writes one row here after its data commit,
under the same Delta app transaction when it has one, so a replay counts it once: an enqueue, a
delivery from another queue's transmission, a send dead-lettered in its sender (it never left), a
redrive to another queue (negative in the queue it left). Moves within a queue write nothing.

A lake made before the ledger existed gets it on the first such write (or check) with an opening
balance: every row in its places and terminal ledgers at that moment, under one app transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED, QUARANTINE
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import INTAKE, PURGED, QueueTables

ENQUEUE = "enqueue"
UNSENT = "unsent"
OPENING = "opening balance"
_OPENING_APP_ID = "poison_pipeline/intake/opening"


def accounted_rows(tables: QueueTables) -> int:
    """Rows in the queue's places and terminal ledgers, from the Delta logs alone."""
    places = (*tables.waiting, DEAD_LETTER, QUARANTINE, PROCESSED, PURGED)
    return sum(tables.open(table).count() for table in places if tables.exists(table))


def ensure_intake(tables: QueueTables, now: datetime | None = None) -> None:
    """Create the intake ledger if missing; call before the data commit of what it will record."""
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
        record_intake(tables, OPENING, OPENING, opening, now, app_id=_OPENING_APP_ID, version=1)


def record_intake(tables: QueueTables, source: str, batch_id: str | None, messages: int,
                  now: datetime | None = None, app_id: str | None = None, version: int = 0) -> None:
    """One intake row; with an app id, written once whatever the replays (the data's own app id)."""
    if messages == 0:
        return
    ensure_intake(tables, now)
    row = {"batch_id": batch_id, "source": source, "messages": messages, "at": now or datetime.now(UTC)}
    tables.append(INTAKE, pa.Table.from_pylist([row], schema=schemas.INTAKE),
                  app_id=None if app_id is None else f"{app_id}/intake", version=version)


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
