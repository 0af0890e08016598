"""`maintain`: compaction, checkpoints and vacuum of a queue's tables, under the queue's lease.

Every enqueue adds a file and a commit to `inbound` (and to `intake`), every cycle adds some to the
ledgers: a queue fed by many small enqueues makes its next cycle read thousands of files and a long
log. Maintenance rewrites each table's small files into large ones (delta-rs `optimize.compact`;
the inbound's batch lookup reads the batch ids of merged files, see `storage.tables`; a waiting
table only when all its rows are due, or a due batch would wait for the others), writes a
checkpoint so a reader starts from it instead of replaying the log, and vacuums the files no
version within the retention still reads.

The vacuum retention never breaks what reads old versions:
- a cycle: maintenance holds the queue's lease, so none runs meanwhile; a table whose cycle was
  interrupted (its journal not `done`) is neither compacted nor vacuumed until a cycle recovers it;
- an undo: it reads the versions a redrive, edit, purge, archive or restore recorded (Delta time
  travel); every version recorded by an action of a kind undo reverses (`undo.UNDOABLE`), done or
  planned and not undone, is kept (vacuum's `keep_versions`), however old;
- dedup reads only the current files of the ledgers, which a vacuum never deletes.

The retention has a floor, the queue's `lease.expiry`: a holder reads its tables' files for as long
as its lease is not expired, so a shorter retention is refused (RetentionTooShort) before anything
is done. delta-rs vacuums in whole hours: the retention is rounded up to the next whole hour, never
down, so a vacuum never deletes a file removed less than an hour ago (`--retention 30m` keeps an
hour; a lease expiry of 90m, two).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations.undo import UNDOABLE
from poison_pipeline.storage.journal import read_entry
from poison_pipeline.storage.tables import ACTIONS, INTAKE, WRITER, QueueTables
from poison_pipeline.storage.writer import QueueWriter, queue_writer

# Delta's own default (delta.deletedFileRetentionDuration): readers of a version that old still work.
DEFAULT_RETENTION = timedelta(days=7)


class RetentionTooShort(ValueError):
    """A vacuum retention below the floor (the queue's lease expiry); nothing was done."""


def retention_hours(retention: timedelta) -> int:
    """The whole hours delta-rs vacuums with: the retention rounded up, at least one."""
    return max(1, math.ceil(retention.total_seconds() / 3600))


@dataclass(frozen=True)
class TableMaintenance:
    table: str
    files_before: int
    files_after: int
    version_before: int
    version_after: int
    vacuumed_files: int
    skipped: str | None  # why the table was left as it was


@dataclass(frozen=True)
class Maintained:
    queue: str
    retention_hours: int | None  # what the vacuum kept, in whole hours; None: not vacuumed
    tables: tuple[TableMaintenance, ...]


def maintain(declaration: Declaration, queue: str, *, vacuum: bool = True,
             retention: timedelta = DEFAULT_RETENTION, run_id: str = "manual") -> Maintained:
    """Compact, checkpoint and (unless `vacuum` is false) vacuum every existing table of `queue`.
    Raises RetentionTooShort, before anything is done, for a retention below the lease expiry."""
    tables = QueueTables.of(declaration, queue)
    floor = tables.lease_settings.expiry
    if vacuum and retention < floor:
        raise RetentionTooShort(
            f"retention {_shown(retention)} is shorter than the queue's lease expiry ({_shown(floor)}): a "
            f"holder may still read files removed that recently; give at least {_shown(floor)} (the vacuum "
            "rounds up to whole hours anyway)")
    done: list[TableMaintenance] = []
    with queue_writer(tables, "maintenance", run_id) as writer:
        keep = _undo_versions(tables)
        for table in (*tables.all_tables, INTAKE):
            if tables.exists(table):
                done.append(_maintain_table(writer, table, retention if vacuum else None, keep.get(table, [])))
    return Maintained(queue, retention_hours(retention) if vacuum else None, tuple(done))


def _shown(duration: timedelta) -> str:
    return f"{duration.total_seconds():g}s"


def _undo_versions(tables: QueueTables) -> dict[str, list[int]]:
    """The versions of this queue's tables that an undo may still read: those recorded by every
    action of a kind undo reverses, not undone."""
    if not tables.exists(ACTIONS):
        return {}
    actions = tables.open(ACTIONS).to_pyarrow_table(columns=["kind", "state", "versions"])
    undoable = actions.filter(pc.and_(pc.is_in(actions["kind"], pa.array(UNDOABLE)),
                                      pc.is_in(actions["state"], pa.array(["done", "planned"]))))
    keep: dict[str, set[int]] = {}
    for versions in undoable["versions"].to_pylist():
        for name, pair in json.loads(versions or "{}").items():
            queue, _, table = name.partition("/")
            if queue == tables.queue:
                keep.setdefault(table, set()).update(v for v in (pair or {}).values() if isinstance(v, int))
    return {table: sorted(versions) for table, versions in keep.items()}


def _maintain_table(writer: QueueWriter, table: str, retention: timedelta | None,
                    keep_versions: list[int]) -> TableMaintenance:
    tables = writer.tables
    target = tables.open(table)
    files_before, version_before = len(target.file_uris()), target.version()
    entry = read_entry(tables, table) if table in tables.waiting else None
    if entry is not None and entry.state != "done":
        return TableMaintenance(table, files_before, files_before, version_before, version_before, 0,
                                f"its {entry.state} cycle {entry.seq} awaits recovery by the next cycle")
    waiting = tables.stats(table, datetime.now(UTC)) if table in tables.waiting else None
    # A file mixing a due batch with one not yet due holds the due one back (storage.tables): a
    # waiting table is compacted only when every row in it is due.
    if files_before > 1 and (waiting is None or waiting.due_rows == waiting.rows):
        writer.check()
        # As the product writes every table; the fence keeps a holder that lost its lease out.
        target.optimize.compact(writer_properties=WRITER, commit_properties=writer.properties(target, table))
    writer.check()
    target.create_checkpoint()
    vacuumed = 0
    if retention is not None:
        writer.check()
        vacuumed = len(target.vacuum(retention_hours=retention_hours(retention), dry_run=False,
                                     enforce_retention_duration=False, keep_versions=keep_versions))
    target = DeltaTable(tables.uri(table), storage_options=tables.storage_options)
    return TableMaintenance(table, files_before, len(target.file_uris()), version_before, target.version(),
                            vacuumed, None)
