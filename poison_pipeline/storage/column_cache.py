"""Rows of a Delta table's data files, kept on this machine's disk between calls.

Delta never changes a data file once written and never reuses its name, so a file's rows, once
read, hold for as long as the log lists the file. The cache is a folder of segments, each an Arrow
IPC file of rows and, per row, the index of its file in the segment's list of files (kept in its
schema's metadata): a call appends one segment of what it had to read or take from writers' notes,
and rewrites them all as one only when they grow many or mostly hold files the log dropped.
Segments are memory-mapped, not decoded, so a call costs what changed since the last one.

Writers note the rows of a file they have just committed (`note_rows`): one framed record (magic,
length, CRC-32, a digest of the rows' schema, the file's path, its rows as one Arrow IPC record
batch message) appended to a notes file beside the cache, so the first call after 10,000 small
commits parses one file instead of opening 10,000.

The cache and the notes only ever save reads: a file listed by the log and missing from both is read;
a segment that cannot be read is ignored (and dropped by the next rewrite); a note torn by a crash
fails its CRC and only that file is read; a file held by two segments (two calls racing) is taken once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc

from poison_pipeline.storage.files import files_dataset, local_root, log_names

_FILE = "__file"
_NOTES = ".rows"
# Notes and segments of an older version (JSON lines, parquet): never read, removed when found.
_OLD_NOTES = ".notes"
_OLD_SEGMENT = ".parquet"
_PATHS_KEY = b"paths"
_SEGMENT = "seg-"
_SUFFIX = ".arrow"
_MAGIC = b"PPR1"
_HEADER = struct.Struct("<4sII")  # magic, payload length, CRC-32 of the payload
_PATH_LENGTH = struct.Struct("<I")
_DIGEST = 16
# Rewrite the segments as one past this many, or once the files the log dropped hold more than
# this share of their rows: both keep a call's read near the size of the live table.
_MAX_SEGMENTS = 16
_MAX_DROPPED = 0.25


def _digest(schema: pa.Schema) -> bytes:
    return hashlib.blake2b(schema.remove_metadata().serialize().to_pybytes(), digest_size=_DIGEST).digest()


def notes_file(cache: str) -> str:
    """The file writers append their notes to, beside the local `cache`."""
    return cache + _NOTES


def cache_folder(cache: str) -> str:
    """Where the cache named `cache` (a path beside the tables) is kept: that folder on a local lake;
    for a lake on an object store, a folder of this machine's cache directory ($XDG_CACHE_HOME, else
    ~/.cache) named after it. A data file's rows never change and its name is never reused, so any
    machine may keep a copy of its own: a check there reads only the files it has not read before.
    Notes stay on local lakes: a machine that only writes to a store would keep notes nobody takes."""
    local = local_root(cache)
    if local is not None:
        return local
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "poison_pipeline", hashlib.sha256(cache.encode()).hexdigest()[:32])


def note_rows(cache: str, path: str, rows: pa.Table) -> None:
    """Leave `rows`, the whole content of the data file `path` (as the log names it) that the caller
    has just committed, for the next `cached_rows(cache=cache)` to take instead of opening the file.
    One record appended to a file beside the cache (on this machine's disk only): a record torn by
    a crash, lost in a race or not written at all only means that file is read."""
    cache_path = local_root(cache)
    if cache_path is None:
        return
    if rows.num_rows == 0:
        return
    # The batch alone, without its schema: the reader knows the schema and takes only notes made
    # with it (the digest), so a note costs it one batch to map, not a stream to open.
    batch = rows.combine_chunks().to_batches()[0]
    encoded = path.encode()
    payload = b"".join((_digest(rows.schema), _PATH_LENGTH.pack(len(encoded)), encoded,
                        batch.serialize().to_pybytes()))
    # The commit is made: a note that cannot be written (a full disk) only means the file is read.
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        # One write to a file opened for appending: concurrent writers' records never interleave.
        descriptor = os.open(notes_file(cache_path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, _HEADER.pack(_MAGIC, len(payload), zlib.crc32(payload)) + payload)
        finally:
            os.close(descriptor)


def noted_files(cache: str, schema: pa.Schema) -> list[str]:
    """The files whose rows the notes beside the local `cache` hold, whole records only."""
    return _read_notes(notes_file(cache), schema).paths


@dataclass
class _Part:
    """Rows of the files `paths`: row i belongs to `paths[files[i]]`."""

    paths: list[str]
    files: np.ndarray
    rows: pa.Table


def _empty(schema: pa.Schema) -> _Part:
    return _Part([], np.array([], np.int64), schema.empty_table())


def _record(data: bytes, buffer: pa.Buffer, at: int, digest: bytes,
            schema: pa.Schema) -> tuple[str | None, pa.RecordBatch | None, int] | None:
    """The note starting at `at`: its file, its rows and where it ends (file and rows None for a
    whole note of another schema); None when torn."""
    if at + _HEADER.size > len(data):
        return None
    _, length, crc = _HEADER.unpack_from(data, at)
    start, end = at + _HEADER.size, at + _HEADER.size + length
    if end > len(data) or length < _DIGEST + _PATH_LENGTH.size or zlib.crc32(memoryview(data)[start:end]) != crc:
        return None
    if data[start:start + _DIGEST] != digest:
        return None, None, end
    (size,) = _PATH_LENGTH.unpack_from(data, start + _DIGEST)
    body = start + _DIGEST + _PATH_LENGTH.size + size
    try:
        path = data[start + _DIGEST + _PATH_LENGTH.size:body].decode()
        return path, paipc.read_record_batch(buffer.slice(body, end - body), schema), end
    except (UnicodeDecodeError, ValueError, pa.ArrowException):
        return None


def _read_notes(name: str, schema: pa.Schema) -> _Part:
    """One notes file. A torn record (a crash mid-write) is skipped up to the next record's magic;
    a false magic inside a record fails its CRC, so only whole records are taken."""
    try:
        with open(name, "rb") as handle:
            data = handle.read()
    except OSError:
        return _empty(schema)
    buffer = pa.py_buffer(data)
    digest = _digest(schema)
    noted: dict[str, pa.RecordBatch] = {}
    at = data.find(_MAGIC)
    while at >= 0:
        record = _record(data, buffer, at, digest, schema)
        if record is None:
            at = data.find(_MAGIC, at + 1)
            continue
        path, rows, end = record
        if path is not None and rows is not None:
            noted.setdefault(path, rows)  # a file noted twice holds the same rows
        at = data.find(_MAGIC, end)
    if not noted:
        return _empty(schema)
    return _Part(list(noted), np.repeat(np.arange(len(noted)), [b.num_rows for b in noted.values()]),
                 pa.Table.from_batches(noted.values(), schema))


def _take_notes(cache_path: str, schema: pa.Schema) -> tuple[_Part, list[str]]:
    """The rows noted per file, and the note files read (removed once the cache holds them).
    The notes are moved aside before they are read, so records appended meanwhile wait for the
    next call; notes moved aside by a call that never finished are taken too."""
    taken = f"{cache_path}{_NOTES}.{os.getpid()}.{uuid.uuid4().hex}"
    with contextlib.suppress(FileNotFoundError):
        os.rename(notes_file(cache_path), taken)
    folder, base = os.path.dirname(cache_path), os.path.basename(cache_path)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    for old in (n for n in names if n.startswith(base + _OLD_NOTES)):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, old))
    files = [os.path.join(folder, n) for n in names if n.startswith(base + _NOTES + ".")]
    have: set[str] = set()
    parts = [_kept(p, set(p.paths), have)[0] for p in (_read_notes(name, schema) for name in files)]
    return _join(parts, schema), files


def _segments(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    names = os.listdir(folder)
    for old in (n for n in names if n.startswith(_SEGMENT) and n.endswith(_OLD_SEGMENT)):
        with contextlib.suppress(OSError):
            os.remove(os.path.join(folder, old))
    return sorted(os.path.join(folder, n) for n in names if n.startswith(_SEGMENT) and n.endswith(_SUFFIX))


def _read_segment(segment: str, schema: pa.Schema) -> _Part | None:
    try:
        # Zero-copy: the rows keep the mapping alive after the file is closed (or removed).
        with pa.memory_map(segment) as source:
            table = paipc.open_file(source).read_all()
        paths = json.loads((table.schema.metadata or {})[_PATHS_KEY])
        files = table[_FILE].to_numpy()
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return None  # removed by a concurrent rewrite, or torn: its files are taken elsewhere
    rows = table.drop_columns([_FILE]).replace_schema_metadata(None)
    if not isinstance(paths, list) or rows.schema != schema or (
            len(files) and (files.min() < 0 or files.max() >= len(paths))):
        return None
    return _Part(paths, files, rows)


def _kept(part: _Part, wanted: set[str], have: set[str]) -> tuple[_Part, int]:
    """The rows of files the log lists that no earlier part held, and how many rows were dropped."""
    keep = np.fromiter((p in wanted and p not in have for p in part.paths), bool, len(part.paths))
    paths = [p for p, k in zip(part.paths, keep, strict=True) if k]
    have.update(paths)
    if keep.all():
        return part, 0
    renumber = np.cumsum(keep, dtype=np.int64) - 1
    rows = keep[part.files]
    return _Part(paths, renumber[part.files[rows]], part.rows.filter(pa.array(rows))), int(len(rows) - rows.sum())


def _join(parts: Sequence[_Part], schema: pa.Schema) -> _Part:
    paths: list[str] = []
    files: list[np.ndarray] = []
    for part in parts:
        files.append(part.files.astype(np.int64) + len(paths))
        paths.extend(part.paths)
    rows = pa.concat_tables([p.rows for p in parts]) if parts else schema.empty_table()
    return _Part(paths, np.concatenate(files) if files else np.array([], np.int64), rows)


def _write_segment(folder: str, parts: Sequence[_Part], schema: pa.Schema) -> None:
    whole = _join(parts, schema)
    table = whole.rows.combine_chunks().append_column(_FILE, pa.array(whole.files, pa.int32()))
    table = table.replace_schema_metadata({_PATHS_KEY: json.dumps(whole.paths)})
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".tmp-{os.getpid()}-{uuid.uuid4().hex}")
    with paipc.new_file(temporary, table.schema) as writer:
        writer.write_table(table)
    # Under a new name, after the write: a concurrent reader sees the whole segment or none.
    os.replace(temporary, os.path.join(folder, f"{_SEGMENT}{uuid.uuid4().hex}{_SUFFIX}"))


def _read_files(uri: str, storage_options: dict[str, str], files: Sequence[tuple[str, int]],
                schema: pa.Schema) -> _Part:
    """The rows of `files` (path and size, as the log gives them), on pyarrow's threads. Each batch
    read names its file: no row carries a file name (a million of them cost seconds to map)."""
    names = [p for p, _ in files]
    read = files_dataset(uri, storage_options, names, [s for _, s in files], schema).scanner(columns=schema.names)
    found: list[str] = []
    counts: list[int] = []
    batches: list[pa.RecordBatch] = []
    for tagged in read.scan_batches():
        found.append(tagged.fragment.path)
        counts.append(tagged.record_batch.num_rows)
        batches.append(tagged.record_batch)
    index = {p: i for i, p in enumerate(names)}
    return _Part(names, np.repeat(np.array([index[p] for p in log_names(found, names)], np.int64), counts),
                 pa.Table.from_batches(batches, schema))


def cached_rows(uri: str, storage_options: dict[str, str], paths: Sequence[str], sizes: Sequence[int],
                schema: pa.Schema, cache: str | None) -> pa.Table:
    """The rows (columns of `schema`, as `files_dataset` reads them) of the files `paths`, whatever
    files the cache and the writers' notes (`note_rows`) already hold: only the others are opened.
    `cache`: where the cache is named beside the tables (see `cache_folder`); None: all is read."""
    folder = cache_folder(cache) if cache else None
    wanted = set(paths)
    noted, note_files = _take_notes(folder, schema) if folder else (_empty(schema), [])
    segments = _segments(folder) if folder else []
    have: set[str] = set()
    parts: list[_Part] = []
    dropped, broken = 0, False
    for segment in segments:
        part = _read_segment(segment, schema)
        if part is None:
            broken = True
            continue
        kept, lost = _kept(part, wanted, have)
        parts.append(kept)
        dropped += lost
    fresh = [_kept(noted, wanted, have)[0]]
    new = [(p, s) for p, s in zip(paths, sizes, strict=True) if p not in have]
    if new:
        fresh.append(_read_files(uri, storage_options, new, schema))
    # Notes of files committed after the caller read the log are kept for the next call.
    later = _kept(noted, {p for p in noted.paths if p not in wanted}, set())[0]
    kept_later = [later] if later.paths else []
    fresh = [p for p in fresh if p.paths]
    if folder:
        rows = sum(p.rows.num_rows for p in parts)
        if broken or len(segments) >= _MAX_SEGMENTS or dropped > _MAX_DROPPED * max(rows + dropped, 1):
            _write_segment(folder, [*parts, *fresh, *kept_later], schema)
            for segment in segments:  # only those read: a segment written meanwhile stays
                with contextlib.suppress(OSError):
                    os.remove(segment)
        elif fresh or kept_later:
            _write_segment(folder, [*fresh, *kept_later], schema)
    for name in note_files:  # held by the cache now, or of files the log no longer lists
        with contextlib.suppress(OSError):
            os.remove(name)
    return _join([*parts, *fresh], schema).rows


def added_file(uri: str, version: int, rows: int) -> tuple[str, list[dict[str, Any]]] | None:
    """The one data file the commit `version` of the local table at `uri` added, if it added exactly
    one, of exactly `rows` rows, and the commit's actions (for the caller to recognise its commit);
    None otherwise, or when the log cannot be read."""
    root = local_root(uri)
    if root is None:
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        with open(os.path.join(root, "_delta_log", f"{version:020d}.json")) as handle:
            actions = [json.loads(line) for line in handle if line.strip()]
        adds = [a["add"] for a in actions if "add" in a]
        if len(adds) == 1 and json.loads(adds[0]["stats"])["numRecords"] == rows:
            return str(adds[0]["path"]), actions
    return None
