"""Seeding a table with thousands of one-file appends quickly, in the shape real appends leave.

A real `enqueue` makes two delta-rs commits (inbound, then intake) and opens both tables again for
each: 10,000 of them took 0.1-0.9 s each as the logs grew, hours in all. What they leave is simple:
per commit, one parquet file written by delta-rs and a log entry of a `commitInfo` and one `add`
action whose statistics delta-rs computed from that file; and a checkpoint every
`delta.checkpointInterval` commits, written by delta-rs's post-commit hook. This writes the same:

- the data files are written by delta-rs itself, hundreds per call, into a scratch table
  partitioned by a `_seed_file` column that keeps each append's rows in a file of their own (the
  partition column is not stored in the file, nor in its statistics); each file is then moved into
  the table, and its `add` action (delta-rs's own: size, statistics) is written as a commit of its
  own with `partitionValues` emptied and the path made relative to the table root;
- the commit info is the one delta-rs writes for an append (operation, parameters, metrics,
  engine), with the caller's custom metadata (enqueue's batch id);
- delta-rs writes a checkpoint at each version where its hook would (`checkpoint_versions`).

`compare_logs` (used by the benchmark and its test) checks the result against a lake made by real
calls: the same kinds of actions and keys in every commit, the same statistics columns, schemas,
file layout and checkpoint versions.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.operations.records import parse_texts, waiting_rows
from poison_pipeline.storage import schemas
from poison_pipeline.storage.intake import _BATCH_KEY, ENQUEUE, ensure_intake
from poison_pipeline.storage.message_ids import note_ids
from poison_pipeline.storage.tables import INTAKE, WRITER, QueueTables
from poison_pipeline.storage.writer import LeaseFreeAppender

_PART = "_seed_file"
_CHUNK = 500  # appends written per delta-rs call: bounds the writer's open files and memory
CHECKPOINT_INTERVAL = 100  # delta.checkpointInterval's default: our tables do not set it


def checkpoint_versions(first: int, last: int, interval: int = CHECKPOINT_INTERVAL) -> list[int]:
    """The versions in [first, last] after whose commit delta-rs 1.6.6's post-commit hook writes a
    checkpoint: every `interval`-th commit counting version 0 (the create) as the first, i.e. 99,
    199, ... (`compare_logs` checks this against real appends)."""
    return [v for v in range(first, last + 1) if (v + 1) % interval == 0]


def _log(uri: str) -> str:
    return os.path.join(uri, "_delta_log")


def _commit_file(uri: str, version: int) -> str:
    return os.path.join(_log(uri), f"{version:020d}.json")


def _commit_info(rows: int, metadata: dict[str, str] | None, at_ms: int) -> dict[str, Any]:
    client = f"delta-rs.py-{deltalake.__version__}"
    return {"commitInfo": {
        "timestamp": at_ms, "operation": "WRITE", "operationParameters": {"mode": "Append"},
        "engineInfo": f"delta-rs:py-{deltalake.__version__}", "clientVersion": client, **(metadata or {}),
        "operationMetrics": {"num_added_files": 1, "num_removed_files": 0, "num_partitions": 0,
                             "num_added_rows": rows, "execution_time_ms": 1, "num_retries": 0}}}


def _scratch_adds(scratch: str) -> dict[str, dict[str, Any]]:
    """The add actions of the scratch table's one commit (its create), by the append index they hold."""
    adds: dict[str, dict[str, Any]] = {}
    with open(_commit_file(scratch, 0)) as handle:
        for line in handle:
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                key = add["partitionValues"][_PART]
                if key in adds:
                    raise RuntimeError(f"delta-rs split append {key} into two files: seeding needs one file each")
                adds[key] = add
    return adds


def seed_appends(uri: str, appends: Sequence[pa.Table], metadata: Sequence[dict[str, str] | None],
                 scratch_root: str) -> list[str]:
    """Commit each of `appends` to the existing local table at `uri` as one append of one file, as
    `write_deltalake(mode="append")` with the product's writer properties would; returns the files'
    names. Nobody else may write the table meanwhile."""
    start = DeltaTable(uri).version()
    names: list[str] = []
    checkpoints = set(checkpoint_versions(start + 1, start + len(appends)))
    for first in range(0, len(appends), _CHUNK):
        chunk = appends[first:first + _CHUNK]
        scratch = os.path.join(scratch_root, f"seed-{uuid.uuid4().hex}")
        parts = [t.append_column(_PART, pa.repeat(pa.scalar(str(i)), t.num_rows)) for i, t in enumerate(chunk)]
        write_deltalake(scratch, pa.concat_tables(parts), mode="append", partition_by=[_PART],
                        writer_properties=WRITER)
        adds = _scratch_adds(scratch)
        for i, table in enumerate(chunk):
            add = adds[str(i)]
            name = os.path.basename(add["path"])
            os.rename(os.path.join(scratch, add["path"]), os.path.join(uri, name))
            version = start + first + i + 1
            now_ms = int(time.time() * 1000)
            entry = {**add, "path": name, "partitionValues": {}, "modificationTime": now_ms}
            with open(_commit_file(uri, version), "x") as handle:
                handle.write(json.dumps(_commit_info(table.num_rows, metadata[first + i], now_ms)) + "\n")
                handle.write(json.dumps({"add": entry}) + "\n")
            if version in checkpoints:
                DeltaTable(uri, version=version).create_checkpoint()
            names.append(name)
        shutil.rmtree(scratch)
    return names


def _actions(uri: str, version: int) -> list[dict[str, Any]]:
    with open(_commit_file(uri, version)) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _shape(uri: str, version: int) -> dict[str, Any]:
    """What must be alike in a commit: its action kinds and keys, the commit info's keys, the
    statistics' columns, and the data file's parquet layout."""
    actions = _actions(uri, version)
    shape: dict[str, Any] = {"kinds": [next(iter(a)) for a in actions]}
    for action in actions:
        kind, body = next(iter(action.items()))
        shape[f"{kind}_keys"] = sorted(body)
        if kind == "commitInfo":
            shape["operation"] = (body["operation"], body["operationParameters"], sorted(body["operationMetrics"]))
        if kind == "add":
            stats = json.loads(body["stats"])
            shape["stats"] = {k: sorted(v) if isinstance(v, dict) else "n" for k, v in stats.items()}
            shape["partitionValues"] = body["partitionValues"]
            meta = pq.ParquetFile(os.path.join(uri, body["path"])).metadata
            shape["parquet"] = {"schema": str(meta.schema.to_arrow_schema()), "row_groups": meta.num_row_groups,
                                "compression": sorted({meta.row_group(0).column(c).compression
                                                       for c in range(meta.num_columns)}),
                                "created_by": meta.created_by}
    return shape


def checkpoints_of(uri: str) -> list[int]:
    return sorted(int(name.split(".")[0]) for name in os.listdir(_log(uri)) if name.endswith(".checkpoint.parquet"))


def compare_logs(real: str, seeded: str, versions: Sequence[int]) -> list[str]:
    """How the table at `seeded` differs from `real` (made by real appends): an empty list when the
    commits at `versions` have the same shape, the schemas match and the checkpoints lie at the same
    versions (up to the shorter log)."""
    differences = []
    if DeltaTable(real).schema().to_arrow() != DeltaTable(seeded).schema().to_arrow():
        differences.append("table schemas differ")
    for version in versions:
        a, b = _shape(real, version), _shape(seeded, version)
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                differences.append(f"version {version}: {key}: real {a.get(key)!r}, seeded {b.get(key)!r}")
    last = min(DeltaTable(real).version(), DeltaTable(seeded).version())
    real_cp = [v for v in checkpoints_of(real) if v <= last]
    seeded_cp = [v for v in checkpoints_of(seeded) if v <= last]
    if real_cp != seeded_cp:
        differences.append(f"checkpoints: real at {real_cp}, seeded at {seeded_cp}")
    for version in set(real_cp) & set(seeded_cp):
        name = f"{version:020d}.checkpoint.parquet"
        if pq.read_schema(os.path.join(_log(real), name)) != pq.read_schema(os.path.join(_log(seeded), name)):
            differences.append(f"checkpoint {version}: schemas differ")
    return differences


def seed_enqueues(declaration: Declaration, queue: str, batches: Sequence[Sequence[str]], scratch_root: str) -> int:
    """What `enqueue(declaration, queue, texts)` for each of `batches` (JSON texts, all valid) leaves:
    its rows in inbound (one commit each, named by its batch id), the note of their ids for the
    one_place check, and its intake row (one commit each). Returns the messages seeded."""
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    ensure_intake(LeaseFreeAppender(tables))
    policy = declaration.queue(queue).policy
    inbound: list[pa.Table] = []
    intake: list[pa.Table] = []
    names: list[dict[str, str] | None] = []
    for texts in batches:
        now = datetime.now(UTC)
        parsed, left = parse_texts(pa.array(texts, pa.large_string()), np.arange(1, len(texts) + 1), policy, now)
        if left.any():
            raise ValueError("seed_enqueues takes plainly valid envelopes only")
        batch = f"enq-{uuid.uuid4().hex}"
        inbound.append(waiting_rows(parsed.envelopes, batch, now))
        intake.append(pa.Table.from_pylist([{"batch_id": batch, "source": ENQUEUE, "messages": len(texts), "at": now}],
                                           schema=schemas.INTAKE))
        names.append({_BATCH_KEY: batch})
    files = seed_appends(tables.uri(INBOUND), inbound, names, scratch_root)
    for name, rows in zip(files, inbound, strict=True):
        note_ids(tables, INBOUND, name, rows["message_id"])
    seed_appends(tables.uri(INTAKE), intake, [None] * len(intake), scratch_root)
    return sum(t.num_rows for t in inbound)
