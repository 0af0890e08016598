"""The cycle journal: one small JSON file per waiting table that makes a cycle's commits resumable.

A cycle writes `planned`, stages its results, writes `staged`, then commits to each table; a run
that finds `staged` finishes those commits instead of processing again, so a crash anywhere loses
nothing, duplicates nothing, and never counts an attempt twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from poison_pipeline.storage.faults import writing
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.uri import fs_of

State = Literal["planned", "staged", "done"]


@dataclass
class JournalEntry:
    seq: int
    state: State
    table: str
    run_id: str
    started_at: str
    batches: list[str] = field(default_factory=list)
    staging: str = ""
    summary: dict[str, float] = field(default_factory=dict)


def journal_uri(tables: QueueTables, table: str) -> str:
    """Where the journal of `table`'s cycles lives."""
    return tables.work_uri("journal", f"{table}.json")


def read_entry(uri: str) -> JournalEntry | None:
    found = read_json(uri)
    return None if found is None else JournalEntry(**found)


def write_entry(uri: str, entry: JournalEntry) -> None:
    """Replace the entry atomically: write a temporary file and rename it over the old one."""
    write_json(uri, asdict(entry), f"recording the {entry.table} cycle {entry.seq} as {entry.state} in its journal")


def read_json(uri: str) -> Any:
    """The JSON value in the file at `uri`; None when there is no such file."""
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as stream:
        return json.loads(stream.read())


def write_json(uri: str, value: Any, doing: str) -> None:
    """Write a small JSON file whole or not at all (a temporary file renamed over the old one);
    a storage fault says it was `doing` that."""
    data = json.dumps(value).encode()

    def write(fs: pafs.FileSystem, temporary: str) -> None:
        with fs.open_output_stream(temporary) as stream:
            stream.write(data)

    with writing(doing, uri):
        _replace(uri, write)


def list_files(uri: str) -> list[str]:
    """The files in the folder at `uri`, as URIs (none when there is no such folder)."""
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    prefix = uri[: len(uri) - len(path)] if uri.endswith(path) else ""
    return sorted(prefix + info.path for info in fs.get_file_info(pafs.FileSelector(path))
                  if info.type == pafs.FileType.File and info.path.endswith(".json"))


def remove_file(uri: str) -> None:
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_file(path)


def remove_tree(uri: str) -> None:
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def write_plan(uri: str, rows: pa.Table) -> None:
    """Write an operator command's plan (the rows it will move or delete) whole or not at all."""
    with writing("writing an operator command's plan", uri):
        _replace(uri, lambda fs, temporary: pq.write_table(rows, temporary, filesystem=fs))


def _replace(uri: str, write: Callable[[pafs.FileSystem, str], None]) -> None:
    """Write the file at `uri` whole or not at all: `write` fills a temporary file, renamed over it
    (a killed or failed write leaves no half file)."""
    fs, path = fs_of(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    write(fs, path + ".tmp")
    fs.move(path + ".tmp", path)


def read_plan(uri: str) -> pa.Table | None:
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    return pq.read_table(path, filesystem=fs)
