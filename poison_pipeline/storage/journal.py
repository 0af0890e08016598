"""The cycle journal: one small JSON file per waiting table that makes a cycle's commits resumable.

A cycle writes `planned`, stages its results, writes `staged`, then commits to each table; a run
that finds `staged` finishes those commits instead of processing again, so a crash anywhere loses
nothing, duplicates nothing, and never counts an attempt twice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

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
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as stream:
        return JournalEntry(**json.loads(stream.read()))


def write_entry(uri: str, entry: JournalEntry) -> None:
    """Replace the entry atomically: write a temporary file and rename it over the old one."""
    fs, path = fs_of(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path + ".tmp") as stream:
        stream.write(json.dumps(asdict(entry)).encode())
    fs.move(path + ".tmp", path)


def remove_tree(uri: str) -> None:
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def write_plan(uri: str, rows: pa.Table) -> None:
    """Write an operator command's plan (the rows it will move or delete) whole or not at all."""
    fs, path = fs_of(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(rows, path + ".tmp", filesystem=fs)
    fs.move(path + ".tmp", path)  # a killed write leaves no half plan


def read_plan(uri: str) -> pa.Table | None:
    fs, path = fs_of(uri)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    return pq.read_table(path, filesystem=fs)
