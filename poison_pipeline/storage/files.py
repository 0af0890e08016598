"""Reading a few columns of the data files a Delta log lists, with pyarrow alone.

Checks and sensors read one narrow column of thousands of small files (a queue filled by many small
enqueues between maintenance runs). delta-rs's own dataset would first turn every file's statistics
into a partition expression, and its Python file system handler takes the GIL for every read; a
local lake is read with pyarrow's native file system instead, on pyarrow's threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Sequence
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler


def local_root(uri: str) -> str | None:
    """The folder of a table on this machine's disk; None for an object store."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    # A one-letter scheme is a Windows drive, not a store.
    return uri if len(parsed.scheme) <= 1 else None


def files_dataset(uri: str, storage_options: dict[str, str], paths: Sequence[str], sizes: Sequence[int] | None,
                  schema: pa.Schema) -> pads.Dataset:
    """The files `paths` (relative to the table at `uri`, as its log names them) as one dataset of
    `schema`: no file is opened before it is read, and columns missing from a file read as nulls.
    `sizes` (as the log gives them) spare an object store a request per file; `__filename` of a
    row is absolute on a local lake (see `log_names`)."""
    local = local_root(uri)
    if local is not None:
        return pads.dataset([os.path.join(local, p) for p in paths], schema=schema, format="parquet",
                            filesystem=pafs.LocalFileSystem())
    known = dict(zip(paths, sizes, strict=True)) if sizes is not None else None
    handler = DeltaStorageHandler(uri, storage_options, known)
    return pads.dataset(list(paths), schema=schema, format="parquet", filesystem=pafs.PyFileSystem(handler))


def rows_where_in(uri: str, storage_options: dict[str, str], target: DeltaTable, column: str,
                  values: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of the table whose `column` is one of `values` (short strings), with the columns of
    `schema`: only files whose log statistics may hold one of them are opened, so a lookup in a
    table of thousands of one-commit files reads none or a few. A file without statistics is read."""
    actions = pa.table(target.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return schema.empty_table()
    low, high = f"min.{column}", f"max.{column}"
    if low in actions.column_names and high in actions.column_names:
        mask = pc.or_(pc.is_null(actions[low]), pc.is_null(actions[high]))
        for value in values:
            mask = pc.or_(mask, pc.and_(pc.less_equal(actions[low], value), pc.greater_equal(actions[high], value)))
        actions = actions.filter(mask)
    if actions.num_rows == 0:
        return schema.empty_table()
    dataset = files_dataset(uri, storage_options, actions["path"].to_pylist(), actions["size_bytes"].to_pylist(),
                            schema)
    return dataset.to_table(filter=pc.field(column).isin(list(values)))


def log_names(filenames: Sequence[str], paths: Sequence[str]) -> list[str]:
    """`__filename` values of a `files_dataset(paths)` read, as the log names them (`paths`),
    whatever form the file system gave: Delta names every data file uniquely."""
    names = {os.path.basename(p): p for p in paths}
    return [names[os.path.basename(f)] for f in filenames]


_PATH = "path"
_NOTES = ".notes"


def note_column(cache: str, path: str, values: Sequence[str]) -> None:
    """Leave `values`, the whole `column` of the data file `path` (as the log names it) that the
    caller has just committed, for the next `cached_column(cache=cache)` to take instead of opening
    the file. One JSON line appended to a file beside the cache (on this machine's disk only): a
    line torn by a crash or lost in a race only means that file is read."""
    cache_path = local_root(cache)
    if cache_path is None:
        return
    line = json.dumps({_PATH: path, "values": list(values)}, ensure_ascii=True) + "\n"
    os.makedirs(os.path.dirname(cache_path), exist_ok=True)
    # One write to a file opened for appending: concurrent writers' lines never interleave.
    descriptor = os.open(cache_path + _NOTES, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode("ascii"))
    finally:
        os.close(descriptor)


def _take_notes(cache_path: str) -> tuple[dict[str, list[str]], list[str]]:
    """The values noted per file, and the note files read (removed once the cache holds them).
    The notes are moved aside before they are read, so lines appended meanwhile wait for the next
    call; notes moved aside by a call that never finished are taken too."""
    taken = f"{cache_path}{_NOTES}.{os.getpid()}.{uuid.uuid4().hex}"
    with contextlib.suppress(FileNotFoundError):
        os.rename(cache_path + _NOTES, taken)
    folder, prefix = os.path.dirname(cache_path), os.path.basename(cache_path) + _NOTES + "."
    files = [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(prefix)] \
        if os.path.isdir(folder) else []
    noted: dict[str, list[str]] = {}
    for name in files:
        with contextlib.suppress(OSError), open(name, "rb") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                    path, values = entry[_PATH], entry["values"]
                except (ValueError, KeyError, TypeError):
                    continue  # torn by a crash: that file is read instead
                if isinstance(path, str) and isinstance(values, list) and all(isinstance(v, str) for v in values):
                    noted[path] = values
    return noted, files


def cached_column(uri: str, storage_options: dict[str, str], paths: Sequence[str], sizes: Sequence[int],
                  schema: pa.Schema, column: str, cache: str | None) -> pa.ChunkedArray:
    """`column` of the files `paths` (as `files_dataset` reads it). With `cache`, a parquet file on
    this machine's disk, each file's values are kept there once read: Delta never changes a data
    file once written and never reuses its name, so a file listed again is not opened again, and
    files the log no longer lists drop out. Values a writer noted (`note_column`) are taken the
    same way. The cache and the notes only ever save reads: what is returned is the current files'
    values whatever they hold (a missing or unreadable cache is rebuilt, a file not noted is read)."""
    cache_path = local_root(cache) if cache else None
    wanted = pa.array(list(paths), pa.string())
    known = pa.table({_PATH: pa.array([], pa.string()), column: pa.array([], schema.field(column).type)})
    noted, note_files = _take_notes(cache_path) if cache_path else ({}, [])
    if cache_path and os.path.exists(cache_path):
        try:
            kept = pq.read_table(cache_path)
            known = kept.filter(pc.is_in(kept[_PATH], value_set=wanted)).select([_PATH, column])
        except (OSError, pa.ArrowInvalid, KeyError):
            pass  # rebuilt below from the files themselves
    have = set(pc.unique(known[_PATH]).to_pylist()) if known.num_rows else set()
    parts = [known]
    from_notes = [p for p in paths if p not in have and p in noted]
    if from_notes:
        counts = [len(noted[p]) for p in from_notes]
        parts.append(pa.table({_PATH: pa.array(from_notes, pa.string()).take(
            pa.array(np.repeat(np.arange(len(from_notes)), counts))),
            column: pa.array([v for p in from_notes for v in noted[p]], schema.field(column).type)}))
        have.update(from_notes)
    new = [(p, s) for p, s in zip(paths, sizes, strict=True) if p not in have]
    if new:
        read = files_dataset(uri, storage_options, [p for p, _ in new], [s for _, s in new], schema).to_table(
            columns=[column, "__filename"])
        relative = pa.array(log_names(read["__filename"].to_pylist(), [p for p, _ in new]), pa.string())
        parts.append(pa.table({_PATH: relative, column: read[column]}))
    found = pa.concat_tables(parts)
    # Notes of files committed after the caller read the log are kept for the next call.
    later = [p for p in noted if p not in have]
    if cache_path and (new or from_notes or later or found.num_rows != _rows(cache_path)):
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        temporary = f"{cache_path}.{os.getpid()}.tmp"
        kept_later = pa.table({_PATH: pa.array([p for p in later for _ in noted[p]], pa.string()),
                               column: pa.array([v for p in later for v in noted[p]], schema.field(column).type)})
        pq.write_table(pa.concat_tables([found, kept_later]), temporary)
        os.replace(temporary, cache_path)  # a concurrent reader sees the old cache or the new one
    for name in note_files:  # held by the cache now, or of files the log no longer lists
        with contextlib.suppress(OSError):
            os.remove(name)
    return found[column]


def _rows(path: str) -> int:
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except OSError:
        return -1
