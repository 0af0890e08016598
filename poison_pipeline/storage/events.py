"""Rows appended to a queue's events table after a given Delta version, read with delta-rs only;
and appending events so that a sensor's first evaluation need not open every event's file."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Transaction
from deltalake.exceptions import DeltaError

from poison_pipeline.domain.alerts import QueueEvent, failures_from_json
from poison_pipeline.storage import schemas
from poison_pipeline.storage.column_cache import added_file, cached_rows, note_rows
from poison_pipeline.storage.files import files_where_in
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline.storage.writer import QueueWriter


@dataclass(frozen=True)
class NewEvents:
    version: int
    events: list[QueueEvent]
    # False when the commits after the given version could not be read one by one (their log
    # entries were cleaned up, or the table was recreated) and every event of the table came back.
    incremental: bool


def events_cache(tables: QueueTables, kind: str) -> str:
    """Where the rows of the files holding `kind` events are kept between evaluations (column_cache)."""
    return tables.work_uri("sensors", f"{kind}.events")


def note_events(tables: QueueTables, path: str, rows: pa.Table) -> None:
    """Note `rows`, every event of the file `path` just committed, for the sensor of each kind."""
    for kind in sorted(set(rows["kind"].to_pylist())):
        note_rows(events_cache(tables, kind), path, rows)


def append_events(writer: QueueWriter, rows: pa.Table, app_id: str | None = None, version: int = 0,
                  also: Sequence[Transaction] = ()) -> bool:
    """`writer.append(EVENTS, ...)` that also notes the file it committed for the sensors of each
    kind it holds: a sensor's first evaluation then parses one notes file instead of opening one
    file per event (a thousand failing cycles, a thousand files). A note is left only when the
    commit is recognised as this one (its app transaction) adding exactly these rows."""
    tables = writer.tables
    def note(committed: int) -> None:
        added = added_file(tables.uri(EVENTS), committed, rows.num_rows)
        if added is None:
            return
        path, actions = added
        if app_id is not None and not any(a.get("txn", {}).get("appId") == app_id
                                           and a["txn"].get("version") == version for a in actions):
            return
        # The events are committed: a note that cannot be made must not fail the cycle.
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, pa.ArrowException):
            note_events(tables, path, rows)

    return writer.append(EVENTS, rows, app_id=app_id, version=version, also=also, on_commit=note)


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


def _all_of_kind(tables: QueueTables, table: DeltaTable, kind: str) -> list[dict[str, Any]]:
    """Every `kind` event of the table. Only the files whose statistics may hold one count, and of
    those only the ones neither noted by their writer nor read by an earlier evaluation are opened."""
    actions = files_where_in(table, "kind", [kind])
    if actions.num_rows == 0:
        return []
    rows = cached_rows(tables.uri(EVENTS), tables.storage_options, actions["path"].to_pylist(),
                       actions["size_bytes"].to_pylist(), schemas.EVENTS, events_cache(tables, kind))
    return rows.filter(pc.equal(rows["kind"], kind)).to_pylist()


def events_after(tables: QueueTables, after: int | None, kind: str) -> NewEvents:
    """Events of `kind` committed after version `after` (all of them when `after` is None), oldest first."""
    table = tables.open(EVENTS)
    current = table.version()
    if after == current:
        return NewEvents(current, [], True)
    rows = _committed_after(table, after, current, kind) if after is not None and after < current else None
    incremental = rows is not None or after is None
    if rows is None:
        rows = sorted(_all_of_kind(tables, table, kind), key=lambda r: (r["at"], r["event_id"]))
    events: dict[str, QueueEvent] = {}
    for row in rows:
        events.setdefault(row["event_id"], QueueEvent(
            queue=tables.queue, event_id=row["event_id"], kind=row["kind"], at=row["at"],
            actor=row["actor"], reason=row["reason"], message_id=row["message_id"], table=row["table"],
            # Absent from an events table made before the messages_failed columns.
            run_id=row.get("run_id"), cycle_seq=row.get("cycle_seq"), failures=failures_from_json(row.get("failures")),
        ))
    return NewEvents(current, list(events.values()), incremental)
