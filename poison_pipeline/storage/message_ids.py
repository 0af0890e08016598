"""The message ids of a table's files, as the one_place check reads them, and the note an enqueue
leaves of the ids it committed, so that the check need not open the file (a queue filled by
10,000 enqueues between checks would cost it 10,000 parquet footers, about 2 s of CPU)."""

from __future__ import annotations

import contextlib
import json
import os

import pyarrow as pa
from deltalake import DeltaTable

from poison_pipeline.storage.column_cache import cached_column, note_column
from poison_pipeline.storage.files import local_root
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
    return cached_column(tables.uri(table), tables.storage_options, actions["path"].to_pylist(),
                         actions["size_bytes"].to_pylist(), IDS, "message_id", ids_cache(tables, table))


def note_appended_ids(tables: QueueTables, table: str, target: DeltaTable, before: int, key: str, batch_id: str,
                      ids: pa.Array | pa.ChunkedArray) -> None:
    """After `target` (the handle the append was made through, opened at version `before`) committed
    `ids` under `batch_id` (commit info `key`): note them for the check when that commit is found
    to have added exactly one file of exactly those rows. On a local lake only; anything unexpected
    (a retried commit on another handle, several files, an unreadable log) just leaves no note."""
    root = local_root(tables.uri(table))
    version = target.version()
    if root is None or version <= before:
        return
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(os.path.join(root, "_delta_log", f"{version:020d}.json")) as handle:
            actions = [json.loads(line) for line in handle if line.strip()]
        info = [a["commitInfo"] for a in actions if "commitInfo" in a]
        adds = [a["add"] for a in actions if "add" in a]
        if len(info) != 1 or info[0].get(key) != batch_id or len(adds) != 1 or len(actions) != 2:
            return
        if json.loads(adds[0]["stats"])["numRecords"] != len(ids):
            return
        note_column(ids_cache(tables, table), adds[0]["path"], ids.to_pylist())
