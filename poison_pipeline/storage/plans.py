"""Operator actions' plans: what a redrive or a purge will move or delete, kept in the queue's
`plans` Delta table until the action is done, so that a run killed at any point and started again
moves exactly what the first run planned, and no further.

A plan is written, read and removed by commits of the lease holder's fenced writer: a holder paused
past its lease can neither write a plan nor remove one. The rows of a plan keep their own schema:
each part is an Arrow IPC stream in one row, with the versions of the tables the plan read them from
(a replay checks that the messages are still where the plan found them). A plan left by an earlier
release as a parquet file beside the tables is still read, and removed with the action.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from poison_pipeline.storage import schemas
from poison_pipeline.storage.journal import remove_tree
from poison_pipeline.storage.tables import PLANS, QueueTables
from poison_pipeline.storage.uri import fs_of
from poison_pipeline.storage.writer import QueueWriter

# Rows per part: a part is one binary value, which a parquet page holds whole.
_PART_ROWS = 20_000


@dataclass(frozen=True)
class Plan:
    rows: pa.Table
    # The version of each table the rows were read from ({} for a plan of an earlier release).
    versions: dict[str, int | None] = field(default_factory=dict)


def _legacy_uri(tables: QueueTables, kind: str, action_id: str) -> str:
    return tables.work_uri(kind, action_id, "plan.parquet")


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def write_plan(writer: QueueWriter, kind: str, action_id: str, rows: pa.Table,
               versions: dict[str, int | None]) -> None:
    """Record the plan of action `action_id` in one commit (all its parts or none)."""
    parts = []
    for index, start in enumerate(range(0, max(rows.num_rows, 1), _PART_ROWS)):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as stream:
            stream.write_table(rows.slice(start, _PART_ROWS))
        parts.append({"action_id": action_id, "kind": kind, "part": index, "rows": sink.getvalue().to_pybytes(),
                      "versions": json.dumps(versions, sort_keys=True), "epoch": writer.epoch})
    writer.append(PLANS, pa.Table.from_pylist(parts, schema=schemas.PLANS))


def read_plan(tables: QueueTables, kind: str, action_id: str) -> Plan | None:
    """The plan of action `action_id`; None when none is recorded (not planned yet, or done)."""
    if tables.exists(PLANS):
        found = tables.open(PLANS).to_pyarrow_dataset().to_table(
            columns=["part", "rows", "versions"], filter=pads.field("action_id") == action_id).to_pylist()
        if found:
            found.sort(key=lambda part: part["part"])
            rows = pa.concat_tables(pa.ipc.open_stream(part["rows"]).read_all() for part in found)
            return Plan(rows, json.loads(found[0]["versions"] or "{}"))
    fs, path = fs_of(_legacy_uri(tables, kind, action_id), tables.storage_options)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    return Plan(pq.read_table(path, filesystem=fs))


def remove_plan(writer: QueueWriter, kind: str, action_id: str) -> None:
    """Remove the plan of a finished action (nothing reads it any more); a plan removed already
    commits nothing."""
    tables = writer.tables
    if tables.exists(PLANS) and tables.open(PLANS).to_pyarrow_dataset().head(
            1, columns=["part"], filter=pads.field("action_id") == action_id).num_rows:
        writer.overwrite_where(PLANS, schemas.PLANS.empty_table(), f"action_id = {_quoted(action_id)}",
                               f"removing the plan of action {action_id}")
    remove_tree(tables.work_uri(kind, action_id), tables.storage_options)


def remove_finished_plans(writer: QueueWriter, finished: Callable[[str], bool]) -> list[str]:
    """Remove every plan whose action `finished(action_id)` says is no longer planned: a run killed
    after it recorded its action done and before it removed the plan left it (a rerun by the same
    id removes it too). Returns the ids of the actions whose plans it removed; none, no commit."""
    plans = writer.latest_if_exists(PLANS)
    if plans is None:
        return []
    found = plans.to_pyarrow_dataset().to_table(columns=["action_id", "kind"]).to_pylist()
    left = sorted({(row["action_id"], row["kind"]) for row in found})
    removed = []
    for action_id, kind in left:
        if finished(action_id):
            remove_plan(writer, kind, action_id)
            removed.append(action_id)
    return removed
