"""A result computed from a queue's tables, kept until one of the tables it read changes.

A reader (an asset check) runs on `RecordingTables`, which notes the version each table was read
at (-1 for a table that did not exist). The result is kept with those versions, in the cache folder
of the queue (column_cache.cache_folder: beside the tables on a local lake, this machine's cache
directory for a lake on an object store). The next reader asks the store whether the log entry
after each noted version exists (a version is written once: absent means no commit since) and
whether the queue's note of its tables (`_work/tables.json`, QueueTables.ensure) is the same file:
a queue whose folder was deleted and started afresh counts its versions from 0 again, under a new
note. A result is kept with what of the declaration it depends on too (the queue's waiting tables,
which decide what a check counts): one kept under another declaration is computed again. One
request per table and two for the note, whatever the tables' history, where loading a table reads
its last checkpoint and every commit since (three times, with delta-rs 1.x).

A memo that cannot be read (missing, torn, from another version) only means the result is computed.
A table deleted by hand (which every cycle then refuses, naming it) is not noticed by a kept result
until one of the other tables it read changes: telling it apart costs a second request per table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow.fs as pafs
from deltalake import DeltaTable

from poison_pipeline.storage.column_cache import cache_folder
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.uri import absent, fs_of_all, whole

__all__ = ["RecordingTables", "remembered"]

T = TypeVar("T")
_NOTE = "tables.json"
_FORMAT = 1


@dataclass(frozen=True)
class RecordingTables(QueueTables):
    """A queue's tables that note the version each one was read at, for `remembered`."""

    read: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def over(cls, tables: QueueTables) -> RecordingTables:
        return cls(tables.lake_root, tables.queue, tables.storage_options, tables.waiting, tables.lease_settings)

    def open(self, table: str) -> DeltaTable:
        try:
            snapshot = super().open(table)
        except FileNotFoundError:
            self._saw(table, -1)
            raise
        self._saw(table, snapshot.version())
        return snapshot

    def exists(self, table: str) -> bool:
        found = super().exists(table)
        if not found:
            self._saw(table, -1)
        return found

    def _saw(self, table: str, version: int) -> None:
        # Read twice at two versions: the older one, so that the later commit counts as a change.
        self.read[table] = min(version, self.read.get(table, version))


def remembered(tables: QueueTables, key: str, compute: Callable[[QueueTables], T],
               encode: Callable[[T], Any], decode: Callable[[Any], T]) -> T:
    """`compute(tables)`, or the value it gave last time (kept under `key`, JSON by `encode`) when
    none of the tables it read has changed since."""
    path = os.path.join(cache_folder(tables.work_uri("memo")), f"{key}.json")
    kept = _load(path)
    declared = _declared(tables)
    if kept is not None and kept.get("format") == _FORMAT and kept.get("declared") == declared:
        versions, note = kept["versions"], kept["note"]
        if note is not None and _marks(tables, versions) == (note, True):
            return decode(kept["value"])
    recording = RecordingTables.over(tables)
    note_before = _marks(tables, {})[0]
    value = compute(recording)
    if note_before is not None:
        record = {"format": _FORMAT, "note": note_before, "declared": declared, "versions": recording.read,
                  "value": encode(value)}
        try:
            with whole(path, {}) as stream:
                stream.write(json.dumps(record).encode())
        except OSError:
            pass  # a cache that cannot be written only means the next reader computes again
    return value


def _declared(tables: QueueTables) -> dict[str, Any]:
    """What of the declaration a result depends on, beside the tables' versions: which tables the
    queue waits in (a lowered max_retry_cycles, a retry subqueue still draining) and where they are.
    A result kept under another declaration is computed again."""
    return {"lake_root": tables.lake_root, "queue": tables.queue, "waiting": list(tables.waiting)}


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as stream:
            found = json.loads(stream.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _marks(tables: QueueTables, versions: dict[str, int]) -> tuple[str | None, bool]:
    """The mark of the queue's note of its tables (None without one), and whether no table of
    `versions` has a log entry after its version: one request each, asked together."""
    names = sorted(versions)
    uris = [tables.work_uri(_NOTE), *(f"{tables.uri(t)}/_delta_log/{versions[t] + 1:020d}.json" for t in names)]
    fs, paths = fs_of_all(uris, tables.storage_options)
    note = fs.get_file_info(paths[0])
    mark = None if note.type == pafs.FileType.NotFound else f"{note.size}/{note.mtime_ns}"
    return mark, all(absent(fs, paths[1:]))
