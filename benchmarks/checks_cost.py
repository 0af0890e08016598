"""What the asset checks of a queue cost with 1,000,000 messages waiting, against the honest floor.

Data (not timed): `--messages` enqueued through the product's own `enqueue` in `--files` batches (one
Delta file each, as a real queue fills up), plus `--failed` rows in each of retry_1, poison and
dead_letter (with their intake rows, so the conservation line balances).

Timed, median of `--rounds` (interleaved: one of each per round): each check function as the
Dagster step calls it (no Dagster, no Spark), and two floors: `narrow_read` (pyarrow alone reading
the `message_id` column of every file of the five tables one_place reads: what one_place cannot
avoid) and `log_read` (delta-rs opening the nine tables the log-only checks read and listing their
add actions). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.dataset as pads
from deltalake import DeltaTable

sys.path.insert(0, os.path.dirname(__file__))
import bench_handler  # noqa: E402
from cycle_throughput import emit  # noqa: E402

from poison_pipeline.domain.declaration import AgeLevels, Declaration, DepthLevels, parse_declaration  # noqa: E402
from poison_pipeline.domain.envelope import parse_envelope  # noqa: E402
from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND, POISON, PROCESSED, QUARANTINE  # noqa: E402
from poison_pipeline.operations.checks import (  # noqa: E402
    DEAD_LETTER_GROWTH,
    POISON_GROWTH,
    check_conservation,
    check_depth,
    check_growth,
    check_oldest_waiting,
    check_one_place,
)
from poison_pipeline.operations.records import enqueue, message_rows  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.intake import record_intake  # noqa: E402
from poison_pipeline.storage.tables import PURGED, QueueTables  # noqa: E402
from poison_pipeline.storage.writer import QueueWriter, queue_writer  # noqa: E402

QUEUE = "bench"


def bench_declaration(workdir: str) -> Declaration:
    return parse_declaration({"lake_root": f"{workdir}/lake", "queues": {QUEUE: {
        "handler": bench_handler.HANDLER, "policy": {"max_retry_cycles": 1, "receive_error_handling": "move"}}}})


def _fill(declaration: Declaration, messages: int, files: int, failed: int) -> None:
    per_file = messages // files
    for f in range(files):
        records = [{"message_id": f"m-{f}-{i}", "message_type": "order", "body": {"n": i, "pad": "x" * 150}}
                   for i in range(per_file)]
        assert enqueue(declaration, QUEUE, records).accepted == per_file
    fill_failed(declaration, failed)


def fill_failed(declaration: Declaration, failed: int) -> None:
    """`failed` rows in each of retry_1, poison and dead_letter, ten batches each, with their intake rows."""
    tables = QueueTables.of(declaration, QUEUE)
    now = datetime.now(UTC)
    with queue_writer(tables, "benchmark") as writer:
        for table in ("retry_1", POISON, DEAD_LETTER):
            _fill_table(writer, table, failed, now)


def _fill_table(writer: QueueWriter, table: str, failed: int, now: datetime) -> None:
    """Ten batches of `failed` rows of `table`, as ten cycles would leave them, with their intake rows."""
    envelopes = [parse_envelope({"message_id": f"{table}-{i}", "message_type": "order", "body": {"n": i}},
                                now, None, 1 << 22) for i in range(failed)]
    for part in range(10):
        batch = f"bench-{table}-{part}"
        rows = message_rows(envelopes[part::10], batch, now - timedelta(minutes=5))
        if table == DEAD_LETTER:
            rows = schemas.project(rows, schemas.DEAD_LETTER, reason="rejected", from_table="inbound",
                                   dead_lettered_at=now)
        writer.append(table, rows)
        record_intake(writer, "benchmark", batch, rows.num_rows, now)


def _interleaved(works: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median milliseconds of each, one of each per round, so a busy moment hits them all alike."""
    times: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(rounds):
        for name, work in works.items():
            started = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - started)
    return {name: round(statistics.median(t) * 1000, 1) for name, t in times.items()}


def _narrow_read(tables: QueueTables) -> int:
    rows = 0
    for table in (*tables.waiting, DEAD_LETTER, QUARANTINE):
        files = DeltaTable(tables.uri(table)).file_uris()
        if files:
            rows += pads.dataset(files, format="parquet").to_table(columns=["message_id"]).num_rows
    return rows


def _log_read(tables: QueueTables) -> int:
    return sum(DeltaTable(tables.uri(t)).get_add_actions(flatten=True).num_rows
               for t in (*tables.waiting, DEAD_LETTER, QUARANTINE, PROCESSED, PURGED, "intake"))


def run(workdir: str, messages: int, files: int, failed: int, rounds: int) -> dict[str, Any]:
    declaration = bench_declaration(workdir)
    tables = QueueTables.of(declaration, QUEUE)
    fill_s = None
    if not tables.exists(INBOUND):  # a kept --workdir is measured again as it is
        started = time.perf_counter()
        _fill(declaration, messages, files, failed)
        fill_s = round(time.perf_counter() - started, 1)
    assert check_conservation(tables).passed and check_one_place(tables).passed
    hour = AgeLevels(warn=timedelta(hours=1))
    checks = {
        "conservation": lambda: check_conservation(tables),
        "one_place": lambda: check_one_place(tables),
        "poison_growth": lambda: check_growth(tables, POISON_GROWTH, 100, None),
        "dead_letter_growth": lambda: check_growth(tables, DEAD_LETTER_GROWTH, 100, None),
        "oldest_waiting_inbound": lambda: check_oldest_waiting(tables, INBOUND, hour),
        "depth_quarantine": lambda: check_depth(tables, QUARANTINE, DepthLevels(warn=1)),
    }
    floors = {"narrow_read": lambda: _narrow_read(tables), "log_read": lambda: _log_read(tables)}
    timed = _interleaved({**checks, **floors}, rounds)
    result: dict[str, Any] = {"benchmark": "checks_cost", "messages_waiting": tables.open(INBOUND).count(),
                              "files": len(tables.open(INBOUND).file_uris()), "failed_per_table": failed,
                              "rounds": rounds, "fill_s": fill_s}
    result["check_ms"] = {name: timed[name] for name in checks}
    result["all_checks_ms"] = round(sum(result["check_ms"].values()), 1)
    result["floor_ms"] = {name: timed[name] for name in floors}
    result["load_average"] = [round(v, 2) for v in os.getloadavg()]
    result["cpus"] = os.cpu_count()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--failed", type=int, default=10_000, help="rows in each of retry_1, poison, dead_letter")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workdir", default=None, help="keep the lake here; a kept lake is measured again")
    args = parser.parse_args()
    return emit(lambda folder: run(folder, args.messages, args.files, args.failed, args.rounds), args.workdir,
                "checks-cost-")


if __name__ == "__main__":
    sys.exit(main())
