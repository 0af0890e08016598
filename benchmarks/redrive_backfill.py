"""What redriving a range of failure days as a Dagster backfill costs: one in-process run of the
redrive asset over `--days` daily partitions (one run, BackfillPolicy.single_run), against the
baseline of one plain `redrive_table()` call over the same time range (what the CLI does).

`--per-day` poison messages failed on each of the last `--days` days (rows written with delta-rs: no
Spark, as the redrive itself uses none). Each round copies the same lake for both variants, in
alternating order, so a busy moment hits both. Prints one JSON line: seconds per variant (median,
max), messages moved, the ratio and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, os.path.dirname(__file__))
from cycle_throughput import emit  # noqa: E402

from poison_pipeline.defs.build import build_definitions  # noqa: E402
from poison_pipeline.defs.naming import redrive_asset_key, redrive_job_name  # noqa: E402
from poison_pipeline.domain.declaration import parse_declaration  # noqa: E402
from poison_pipeline.operations.redrive import redrive_table  # noqa: E402
from poison_pipeline.operations.selection import Selection  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.tables import QueueTables  # noqa: E402
from poison_pipeline.storage.writer import queue_writer  # noqa: E402

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def _failures(days: int, per_day: int, today: datetime) -> pa.Table:
    rows: list[dict[str, Any]] = []
    for d in range(days):
        failed = today - timedelta(days=days - d)
        for n in range(per_day):
            rows.append({"message_id": f"m-{d}-{n}", "message_type": "order", "body": b"{}", "encoding": "json",
                         "enqueued_at": failed, "abort_count": 1, "total_abort_count": 1, "move_count": 1,
                         "redrive_count": 0, "due_at": failed, "entered_at": failed, "batch_id": f"b-{d}",
                         "last_error_type": "ValueError", "last_error_message": "bad", "last_error_signature":
                         "0123456789abcdef"})
    return pa.Table.from_pylist(rows, schema=schemas.MESSAGE)


def _declaration(lake: Path):
    return parse_declaration({"lake_root": str(lake), "queues": {"q": {
        "handler": "poison_pipeline.examples.handlers:withdraw_inventory", "policy": {"max_redrives": 10}}}})


def _dagster(lake: Path, first: str, last: str) -> int:
    from dagster import DagsterInstance, IntMetadataValue
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    job = build_definitions(_declaration(lake)).resolve_job_def(redrive_job_name("q"))
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, run_config=QUIET, tags={
            ASSET_PARTITION_RANGE_START_TAG: first, ASSET_PARTITION_RANGE_END_TAG: last})
    # The run also materializes the failure tables it changed: the redrive asset's says what moved.
    [event, *_] = [e for e in result.get_asset_materialization_events() if e.asset_key == redrive_asset_key("q")]
    moved = event.step_materialization_data.materialization.metadata["moved"]
    assert isinstance(moved, IntMetadataValue) and moved.value is not None  # MetadataValue.int(...)
    return moved.value


def _plain(lake: Path, start: datetime, end: datetime) -> int:
    return redrive_table(_declaration(lake), "q", "poison", Selection(failed_after=start, failed_before=end)).moved


def run(days: int, per_day: int, rounds: int, workdir: str) -> dict[str, Any]:
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    template = Path(workdir) / "template"
    tables = QueueTables.of(_declaration(template), "q")
    tables.ensure()
    with queue_writer(tables, "benchmark") as writer:
        writer.append("poison", _failures(days, per_day, today))
    start = (today - timedelta(days=days)).replace(hour=0)
    end = today.replace(hour=0)
    first, last = start.strftime("%Y-%m-%d"), (end - timedelta(days=1)).strftime("%Y-%m-%d")
    timings: dict[str, list[float]] = {"dagster_run_s": [], "plain_call_s": []}
    moved: dict[str, int] = {}
    variants = {"dagster_run_s": lambda lake: _dagster(lake, first, last),
                "plain_call_s": lambda lake: _plain(lake, start, end)}
    _dagster(_copy(template, Path(workdir) / "warm"), first, last)  # imports and first definitions build
    for r in range(rounds):
        for name in sorted(variants, reverse=bool(r % 2)):
            lake = _copy(template, Path(workdir) / f"{name}-{r}")
            started = time.perf_counter()
            moved[name] = variants[name](lake)
            timings[name].append(time.perf_counter() - started)
    summary = {name: {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for name, v in timings.items()}
    return {"benchmark": "redrive_backfill", "days": days, "per_day": per_day, "rounds": rounds, "moved": moved,
            **summary, "ratio": round(summary["dagster_run_s"]["median"] / summary["plain_call_s"]["median"], 2),
            "load_average": [round(v, 2) for v in os.getloadavg()]}


def _copy(template: Path, to: Path) -> Path:
    shutil.copytree(template, to)
    return to


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    return emit(lambda folder: run(args.days, args.per_day, args.rounds, folder), args.workdir, "redrive_backfill_")


if __name__ == "__main__":
    sys.exit(main())
