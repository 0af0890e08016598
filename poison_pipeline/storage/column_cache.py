"""One string column of a Delta table's data files, kept on this machine's disk between calls.

Delta never changes a data file once written and never reuses its name, so a file's values, once
read, hold for as long as the log lists the file. The cache is a folder of segments, each a parquet
file of the values and, per row, the index of its file in the segment's list of files (kept in the
parquet footer): a call appends one segment of what it had to read or take from writers' notes, and
rewrites them all as one only when they grow many or mostly hold files the log dropped. So a call
costs one read of the cached values (plain strings, uncompressed: random ids do not compress, and
decoding is the cost) and otherwise what changed since the last call, not a rewrite of the table.

The cache and the notes only ever save reads: a file listed by the log and missing from both is read;
a segment that cannot be read is ignored (and dropped by the next rewrite); a file held by two
segments (two calls racing) is taken once.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from poison_pipeline.storage.files import files_dataset, local_root, log_names

_PATH = "path"
_FILE = "file"
_NOTES = ".notes"
_PATHS_KEY = b"paths"
_SEGMENT = "seg-"
_NOTE = pa.schema([pa.field(_PATH, pa.string()), pa.field("values", pa.list_(pa.string()))])
# Rewrite the segments as one past this many, or once the files the log dropped hold more than
# this share of their rows: both keep a call's read near the size of the live table.
_MAX_SEGMENTS = 16
_MAX_DROPPED = 0.25


def note_column(cache: str, path: str, values: Sequence[str]) -> None:
    """Leave `values`, the whole column of the data file `path` (as the log names it) that the
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


@dataclass
class _Part:
    """Values of the files `paths`: row i belongs to `paths[files[i]]`."""

    paths: list[str]
    files: np.ndarray
    values: pa.Array | pa.ChunkedArray


def _read_notes(name: str, kind: pa.DataType) -> _Part:
    """One notes file, parsed by pyarrow's JSON reader; line by line when that refuses it (a line
    torn by a crash: only that line is lost)."""
    with contextlib.suppress(pa.ArrowInvalid, OSError):
        table = pajson.read_json(name, parse_options=pajson.ParseOptions(
            explicit_schema=_NOTE, unexpected_field_behavior="ignore"))
        lists = table["values"].combine_chunks()
        values = lists.flatten()
        paths = table[_PATH].to_pylist()
        if lists.null_count == 0 and values.null_count == 0 and None not in paths and len(set(paths)) == len(paths):
            counts = pc.list_value_length(lists).to_numpy()
            return _Part(paths, np.repeat(np.arange(len(paths)), counts), values.cast(kind))
    noted: dict[str, list[str]] = {}
    with contextlib.suppress(OSError), open(name, "rb") as handle:
        for line in handle:
            try:
                entry = json.loads(line)
                path, values = entry[_PATH], entry["values"]
            except (ValueError, KeyError, TypeError):
                continue  # torn by a crash: that file is read instead
            if isinstance(path, str) and isinstance(values, list) and all(isinstance(v, str) for v in values):
                noted[path] = values
    return _Part(list(noted), np.repeat(np.arange(len(noted)), [len(v) for v in noted.values()]),
                 pa.array([v for values in noted.values() for v in values], kind))


def _take_notes(cache_path: str, kind: pa.DataType) -> tuple[_Part, list[str]]:
    """The values noted per file, and the note files read (removed once the cache holds them).
    The notes are moved aside before they are read, so lines appended meanwhile wait for the next
    call; notes moved aside by a call that never finished are taken too."""
    taken = f"{cache_path}{_NOTES}.{os.getpid()}.{uuid.uuid4().hex}"
    with contextlib.suppress(FileNotFoundError):
        os.rename(cache_path + _NOTES, taken)
    folder, prefix = os.path.dirname(cache_path), os.path.basename(cache_path) + _NOTES + "."
    files = [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(prefix)] \
        if os.path.isdir(folder) else []
    have: set[str] = set()
    # A file noted twice (notes taken by two racing calls) holds the same values: it is taken once.
    parts = [_kept(p, set(p.paths), have)[0] for p in (_read_notes(name, kind) for name in files)]
    return _join(parts, kind), files


def _segments(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)
                  if n.startswith(_SEGMENT) and n.endswith(".parquet"))


def _read_segment(segment: str, column: str) -> _Part | None:
    try:
        table = pq.read_table(segment, columns=[_FILE, column])
        paths = json.loads((table.schema.metadata or {})[_PATHS_KEY])
        files = table[_FILE].to_numpy()
    except (OSError, pa.ArrowInvalid, KeyError, ValueError):
        return None  # removed by a concurrent rewrite, or torn: its files are taken elsewhere
    if not isinstance(paths, list) or (len(files) and (files.min() < 0 or files.max() >= len(paths))):
        return None
    return _Part(paths, files, table[column])


def _kept(part: _Part, wanted: set[str], have: set[str]) -> tuple[_Part, int]:
    """The rows of files the log lists that no earlier part held, and how many rows were dropped."""
    keep = np.fromiter((p in wanted and p not in have for p in part.paths), bool, len(part.paths))
    paths = [p for p, k in zip(part.paths, keep, strict=True) if k]
    have.update(paths)
    if keep.all():
        return part, 0
    renumber = np.cumsum(keep, dtype=np.int64) - 1
    rows = keep[part.files]
    return _Part(paths, renumber[part.files[rows]], part.values.filter(pa.array(rows))), int(len(rows) - rows.sum())


def _values(parts: Sequence[_Part], kind: pa.DataType) -> pa.ChunkedArray:
    return pa.chunked_array([c for p in parts for c in
                             (p.values.chunks if isinstance(p.values, pa.ChunkedArray) else [p.values])], kind)


def _join(parts: Sequence[_Part], kind: pa.DataType) -> _Part:
    paths: list[str] = []
    files: list[np.ndarray] = []
    for part in parts:
        files.append(part.files.astype(np.int64) + len(paths))
        paths.extend(part.paths)
    return _Part(paths, np.concatenate(files) if files else np.array([], np.int64), _values(parts, kind))


def _write_segment(folder: str, parts: Sequence[_Part], column: str, kind: pa.DataType) -> None:
    whole = _join(parts, kind)
    table = pa.table({_FILE: pa.array(whole.files, pa.int32()), column: whole.values}).replace_schema_metadata(
        {_PATHS_KEY: json.dumps(whole.paths)})
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".tmp-{os.getpid()}-{uuid.uuid4().hex}")
    pq.write_table(table, temporary, compression="none", use_dictionary=[_FILE], row_group_size=max(table.num_rows, 1))
    # Under a new name, after the write: a concurrent reader sees the whole segment or none.
    os.replace(temporary, os.path.join(folder, f"{_SEGMENT}{uuid.uuid4().hex}.parquet"))


def _read_files(uri: str, storage_options: dict[str, str], files: Sequence[tuple[str, int]], schema: pa.Schema,
                column: str) -> _Part:
    """`column` of `files` (path and size, as the log gives them), on pyarrow's threads. Each batch
    read names its file: no row carries a file name (a million of them cost seconds to map)."""
    names = [p for p, _ in files]
    read = files_dataset(uri, storage_options, names, [s for _, s in files], schema).scanner(columns=[column])
    found: list[str] = []
    counts: list[int] = []
    values: list[pa.Array] = []
    for tagged in read.scan_batches():
        found.append(tagged.fragment.path)
        counts.append(tagged.record_batch.num_rows)
        values.append(tagged.record_batch.column(0))
    index = {p: i for i, p in enumerate(names)}
    return _Part(names, np.repeat(np.array([index[p] for p in log_names(found, names)], np.int64), counts),
                 pa.chunked_array(values, schema.field(column).type))


def cached_column(uri: str, storage_options: dict[str, str], paths: Sequence[str], sizes: Sequence[int],
                  schema: pa.Schema, column: str, cache: str | None) -> pa.ChunkedArray:
    """`column` (a string column of `schema`) of the files `paths` (as `files_dataset` reads them),
    whatever files the cache and the writers' notes (`note_column`) already hold: only the others
    are opened. `cache`: a folder on this machine's disk (none, or on an object store: all is read)."""
    kind = schema.field(column).type
    folder = local_root(cache) if cache else None
    wanted = set(paths)
    noted, note_files = _take_notes(folder, kind) if folder else (_join([], kind), [])
    segments = _segments(folder) if folder else []
    have: set[str] = set()
    parts: list[_Part] = []
    dropped, broken = 0, False
    for segment in segments:
        part = _read_segment(segment, column)
        if part is None:
            broken = True
            continue
        kept, lost = _kept(part, wanted, have)
        parts.append(kept)
        dropped += lost
    fresh = [_kept(noted, wanted, have)[0]]
    new = [(p, s) for p, s in zip(paths, sizes, strict=True) if p not in have]
    if new:
        fresh.append(_read_files(uri, storage_options, new, schema, column))
    # Notes of files committed after the caller read the log are kept for the next call.
    later = _kept(noted, {p for p in noted.paths if p not in wanted}, set())[0]
    kept_later = [later] if later.paths else []
    fresh = [p for p in fresh if p.paths]
    if folder:
        rows = sum(len(p.values) for p in parts)
        if broken or len(segments) >= _MAX_SEGMENTS or dropped > _MAX_DROPPED * max(rows + dropped, 1):
            _write_segment(folder, [*parts, *fresh, *kept_later], column, kind)
            for segment in segments:  # only those read: a segment written meanwhile stays
                with contextlib.suppress(OSError):
                    os.remove(segment)
        elif fresh or kept_later:
            _write_segment(folder, [*fresh, *kept_later], column, kind)
    for name in note_files:  # held by the cache now, or of files the log no longer lists
        with contextlib.suppress(OSError):
            os.remove(name)
    return _values([*parts, *fresh], kind)
