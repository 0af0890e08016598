"""Rows appended to a queue's events table after a given Delta version, read with delta-rs only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from poison_pipeline.domain.alerts import QueueEvent, failures_from_json
from poison_pipeline.storage import schemas
from poison_pipeline.storage.files import rows_where_in
from poison_pipeline.storage.tables import EVENTS, QueueTables


@dataclass(frozen=True)
class NewEvents:
    version: int
    events: list[QueueEvent]
    # False when the commits after the given version could not be read one by one (their log
    # entries were cleaned up, or the table was recreated) and every event of the table came back.
    incremental: bool


def events_version(tables: QueueTables) -> int | None:
    """The events table's current version, from its log alone; None while it does not exist."""
    return tables.open(EVENTS).version() if tables.exists(EVENTS) else None


def _committed_after(table: DeltaTable, after: int, current: int, kind: str) -> list[dict[str, Any]] | None:
    try:
        # The change feed of an append-only table needs no change-data files: delta-rs derives the
        # inserts from each commit's add actions, so only the files of the new commits are read.
        changes = pa.table(table.load_cdf(starting_version=after + 1, ending_version=current)).to_pylist()
    except DeltaError:
        return None
    # Without change-data files a delete that rewrites a file reports its surviving rows as deleted
    # and inserted again: those are not new events.
    rewritten = {r["event_id"] for r in changes if r["_change_type"] == "delete"}
    inserted = [r for r in changes
                if r["_change_type"] == "insert" and r["kind"] == kind and r["event_id"] not in rewritten]
    return sorted(inserted, key=lambda r: (r["_commit_version"], r["at"], r["event_id"]))


def events_after(tables: QueueTables, after: int | None, kind: str) -> NewEvents:
    """Events of `kind` committed after version `after` (all of them when `after` is None), oldest first."""
    table = tables.open(EVENTS)
    current = table.version()
    if after == current:
        return NewEvents(current, [], True)
    rows = _committed_after(table, after, current, kind) if after is not None and after < current else None
    incremental = rows is not None or after is None
    if rows is None:
        # A first evaluation reads every event of its kind: only the files that may hold one are opened.
        snapshot = rows_where_in(tables.uri(EVENTS), tables.storage_options, table, "kind", [kind],
                                 schemas.EVENTS).to_pylist()
        rows = sorted(snapshot, key=lambda r: (r["at"], r["event_id"]))
    events: dict[str, QueueEvent] = {}
    for row in rows:
        events.setdefault(row["event_id"], QueueEvent(
            queue=tables.queue, event_id=row["event_id"], kind=row["kind"], at=row["at"],
            actor=row["actor"], reason=row["reason"], message_id=row["message_id"], table=row["table"],
            # Absent from an events table made before the messages_failed columns.
            run_id=row.get("run_id"), cycle_seq=row.get("cycle_seq"), failures=failures_from_json(row.get("failures")),
        ))
    return NewEvents(current, list(events.values()), incremental)
