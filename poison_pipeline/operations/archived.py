"""Which failed rows are archived: those with a marker in the queue's `archived` table (`archive`).

A marker names one row: its message id and its batch in the table it failed into. A message that
leaves that row (redriven, purged, taken by the poison queue's cycle) leaves its marker behind,
naming no row any more: markers are matched against rows, never counted alone.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.storage.tables import ARCHIVED, QueueTables

__all__ = ["archived_count", "archived_mask", "markers", "row_keys"]


def row_keys(rows: pa.Table) -> pa.Array:
    """One text per row, its message id and batch id: what a marker names."""
    keys = pc.binary_join_element_wise(rows["message_id"], pc.fill_null(rows["batch_id"], ""), "\x00")
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys


def markers(tables: QueueTables, table: str | None = None) -> pa.Table:
    """The markers of `table`'s rows (of every failure table when None); none before any archive."""
    opened = tables.open_if_exists(ARCHIVED)
    if opened is None:
        return pa.table({"message_id": pa.array([], pa.string()), "batch_id": pa.array([], pa.string())})
    dataset = opened.to_pyarrow_dataset()
    return dataset.to_table(filter=None if table is None else pc.field("from_table") == table)


def archived_mask(tables: QueueTables, table: str, rows: pa.Table) -> pa.Array:
    """Which of `rows` (read from `table`, with their message and batch ids) are archived."""
    marked = markers(tables, table)
    if marked.num_rows == 0 or rows.num_rows == 0:
        return pa.array([False] * rows.num_rows, pa.bool_())
    return pc.is_in(row_keys(rows), value_set=row_keys(marked))


def archived_count(tables: QueueTables, table: str) -> int:
    """How many of `table`'s rows are archived (reads its ids only when it has markers)."""
    marked = markers(tables, table)
    if marked.num_rows == 0 or not tables.exists(table):
        return 0
    rows = tables.open(table).to_pyarrow_dataset().to_table(columns=["message_id", "batch_id"])
    return int(pc.sum(archived_mask(tables, table, rows)).as_py() or 0)
