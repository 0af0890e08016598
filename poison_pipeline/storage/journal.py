"""The cycle journal: one row per waiting table in the queue's `journal` Delta table, which makes a
cycle's commits resumable.

A cycle writes `planned`, stages its results, writes `staged`, then commits to each table; a run
that finds `staged` finishes those commits instead of processing again, so a crash anywhere loses
nothing, duplicates nothing, and never counts an attempt twice. Every journal write is a commit of
the lease holder's fenced writer: a holder paused past its lease cannot roll the journal back.

Also here: the small files kept beside the tables (written whole or not at all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import DeltaTable

from poison_pipeline.storage import schemas
from poison_pipeline.storage import uri as lake
from poison_pipeline.storage.faults import writing
from poison_pipeline.storage.tables import JOURNAL, QueueTables
from poison_pipeline.storage.writer import QueueWriter

State = Literal["planned", "staged", "done"]
# The summary key that keeps a probe's size (JournalEntry.probe).
_PROBE = "_probe"


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
    # A probe of a queue an outage disabled: how many messages it tries (0: a cycle as usual).
    # Kept in the row's summary until the cycle is done, so that a recovery commits it as a probe.
    probe: int = 0


def _legacy_uri(tables: QueueTables, table: str) -> str:
    """Where a lake written before the journal was a table kept `table`'s entry (a JSON file)."""
    return tables.work_uri("journal", f"{table}.json")


def read_entry(tables: QueueTables, table: str, *, snapshot: DeltaTable | None = None) -> JournalEntry | None:
    """The entry of `table`'s latest cycle; None before its first. `snapshot`: the journal as the
    caller holds it (a writer's `latest_if_exists`), else it is loaded."""
    journal = snapshot if snapshot is not None else tables.open_if_exists(JOURNAL)
    if journal is not None:
        rows = journal.to_pyarrow_dataset().to_table(
            filter=pads.field("waiting_table") == table).to_pylist()
        if rows:
            row = max(rows, key=lambda r: r["seq"])
            summary = json.loads(row["summary"] or "{}")
            probe = int(summary.pop(_PROBE, 0))
            return JournalEntry(row["seq"], row["state"], table, row["run_id"], row["started_at"],
                                list(row["batches"] or []), row["staging"] or "", summary, probe)
    found = read_json(_legacy_uri(tables, table), tables.storage_options)
    return None if found is None else JournalEntry(**found)


def write_entry(writer: QueueWriter, entry: JournalEntry) -> None:
    """Replace the entry of its table in one fenced commit (refused once another holder took over)."""
    row = {"waiting_table": entry.table, "seq": entry.seq, "state": entry.state, "run_id": entry.run_id,
           "started_at": entry.started_at, "batches": entry.batches, "staging": entry.staging,
           "summary": json.dumps({**entry.summary, **({_PROBE: entry.probe} if entry.probe else {})}),
           "epoch": writer.epoch}
    quoted = entry.table.replace("'", "''")
    writer.overwrite_where(JOURNAL, pa.Table.from_pylist([row], schema=schemas.JOURNAL),
                           f"waiting_table = '{quoted}'",
                           f"recording the {entry.table} cycle {entry.seq} as {entry.state} in its journal")


def read_json(uri: str, storage_options: dict[str, str]) -> Any:
    """The JSON value in the file at `uri`; None when there is no such file."""
    fs, path = lake.fs_of(uri, storage_options)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as stream:
        return json.loads(stream.read())


def write_json(uri: str, storage_options: dict[str, str], value: Any, doing: str) -> None:
    """Write a small JSON file whole or not at all (storage/uri.whole); a storage fault says it
    was `doing` that."""
    data = json.dumps(value).encode()
    with writing(doing, uri), lake.whole(uri, storage_options) as stream:
        stream.write(data)


def list_files(uri: str, storage_options: dict[str, str]) -> list[str]:
    """The JSON files in the folder at `uri`, as URIs (none when there is no such folder)."""
    fs, path = lake.fs_of(uri, storage_options)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    return sorted(lake.uri_in(uri, info.path) for info in fs.get_file_info(pafs.FileSelector(path))
                  if info.type == pafs.FileType.File and info.path.endswith(".json")
                  and not info.base_name.startswith("."))


def remove_file(uri: str, storage_options: dict[str, str]) -> None:
    fs, path = lake.fs_of(uri, storage_options)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_file(path)


def remove_tree(uri: str, storage_options: dict[str, str]) -> None:
    fs, path = lake.fs_of(uri, storage_options)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)
