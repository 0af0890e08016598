"""The message ids of a table's files, as the one_place check reads them, and the note an enqueue
leaves of the ids it committed, so that the check need not open the file (a queue filled by
10,000 enqueues between checks would cost it 10,000 parquet footers, about 2 s of CPU)."""

from __future__ import annotations

import contextlib

import pyarrow as pa
from deltalake import DeltaTable

from poison_pipeline.storage.column_cache import added_file, cached_rows, note_rows
from poison_pipeline.storage.tables import QueueTables

IDS = pa.schema([pa.field("message_id", pa.string())])


def ids_cache(tables: QueueTables, table: str) -> str:
    return tables.work_uri("checks", f"{table}.message_ids")


def message_ids(tables: QueueTables, table: str) -> pa.ChunkedArray:
    """The message ids of a table (repeats kept): one column of the files the log lists, read with
    pyarrow on its threads; a file already read by an earlier check, or noted by the enqueue that
    wrote it, is taken from the check's cache beside the tables instead (storage/column_cache),
    so a check reads only the files nobody noted since its last run."""
    try:
        target = tables.open(table)
    except FileNotFoundError:
        return pa.chunked_array([], pa.string())
    actions = pa.table(target.get_add_actions(flatten=False))
    if actions.num_rows == 0:
        return pa.chunked_array([], pa.string())
    return cached_rows(tables.uri(table), tables.storage_options, actions["path"].to_pylist(),
                       actions["size_bytes"].to_pylist(), IDS, ids_cache(tables, table))["message_id"]


def note_ids(tables: QueueTables, table: str, path: str, ids: pa.Array | pa.ChunkedArray) -> None:
    """Note `ids`, every message id of the data file `path` just committed to `table`, for the check."""
    note_rows(ids_cache(tables, table), path, pa.table({"message_id": ids}).cast(IDS))


def note_appended_ids(tables: QueueTables, table: str, target: DeltaTable, before: int, key: str, batch_id: str,
                      ids: pa.Array | pa.ChunkedArray) -> None:
    """After `target` (the handle the append was made through, opened at version `before`) committed
    `ids` under `batch_id` (commit info `key`): note them for the check when that commit is found
    to have added exactly one file of exactly those rows. On a local lake only; anything unexpected
    (a retried commit on another handle, several files, an unreadable log) just leaves no note."""
    version = target.version()
    if version <= before:
        return
    added = added_file(tables.uri(table), version, len(ids))
    if added is None:
        return
    path, actions = added
    info = [a["commitInfo"] for a in actions if "commitInfo" in a]
    if len(info) == 1 and info[0].get(key) == batch_id and len(actions) == 2:
        # The enqueue is committed: a note that cannot be made must not fail it.
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, pa.ArrowException):
            note_ids(tables, table, path, ids)
