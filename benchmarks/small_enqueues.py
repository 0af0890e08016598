"""The cycle after many small enqueues, with and without maintenance, against the cycle after one.

Data (not timed as the measure): queue `big` gets one enqueue of `--enqueues * --size` messages;
queue `small` gets `--enqueues` enqueues of `--size` messages each (10,000 of 10: 10,000 files and
20,000 commits across inbound and intake), and is then copied as queue `tidy`. Real enqueues of the
full size take about 25 minutes (each opens and commits to a log that grows), so all but the last
`--real` (100) are written by `lake_seed.seed_enqueues`, which leaves what real enqueues leave; the
last ones are real calls, timed: how long an enqueue takes once the log is that long. The first
`--real` enqueues into a fresh queue, timed too, give the start of the log and the reference the
seeded commits are compared with (`seed_differences`, must be empty). `--real` equal to
`--enqueues` makes every enqueue real (no seeding).

Timed, in a warm Spark session: the inbound cycle of `big`; that of `small` as it is
(`--no-unmaintained` skips it); `maintain` of `tidy` (operations/maintenance.py, default
retention) and then its cycle. Also reported: the checkpoints delta-rs wrote in the inbound's log.
Target: tidy's cycle at most 1.5x big's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Spark's Python workers inherit PYTHONPATH from the JVM, which inherits it from this process: they
# must import the benchmark's handler.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(HERE))

import bench_handler  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from lake_seed import compare_logs, seed_enqueues  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.operations.maintenance import maintain  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402
from poison_pipeline.storage.tables import INTAKE, QueueTables  # noqa: E402

TARGET_RATIO = 1.5
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 1, "receive_error_handling": "move"}


def _records(first: int, count: int) -> list[dict[str, Any]]:
    return [{"message_id": f"m-{i}", "message_type": "order",
             "body": {"kind": "ok", "order_id": i, "pad": "x" * 160}} for i in range(first, first + count)]


def _timed_cycle(spark: Any, declaration: Declaration, queue: str) -> float:
    started = time.perf_counter()
    report = run_cycle(spark, declaration, queue, "inbound", run_id=f"bench-{queue}")
    elapsed = time.perf_counter() - started
    assert report.counts["processed"] == report.counts["messages"] > 0, report.counts
    return elapsed


def _timed_enqueues(declaration: Declaration, queue: str, first: int, count: int, size: int) -> list[float]:
    spent = []
    for e in range(first, first + count):
        started = time.perf_counter()
        assert enqueue(declaration, queue, _records(e * size, size)).accepted == size
        spent.append(time.perf_counter() - started)
    return spent


def _seed_differences(declaration: Declaration, enqueues: int) -> list[str]:
    """How the seeded commits of `small` differ from the real ones of `fresh` (empty: alike)."""
    real, seeded = QueueTables.of(declaration, "fresh"), QueueTables.of(declaration, "small")
    versions = sorted({1, min(2, enqueues), max(1, enqueues // 2), enqueues})
    return [f"{table}: {difference}" for table in ("inbound", INTAKE)
            for difference in compare_logs(real.uri(table), seeded.uri(table), versions)]


def measure(enqueues: int, size: int, real: int, unmaintained: bool) -> Any:
    def compute(workdir: str) -> dict[str, Any]:
        load_start = os.getloadavg()
        lake = Path(workdir) / "lake"
        declaration = parse_declaration({"lake_root": str(lake), "queues": {
            name: {"handler": bench_handler.HANDLER, "policy": POLICY}
            for name in ("big", "small", "tidy", "warmup", "fresh")}})
        total = enqueues * size
        assert enqueue(declaration, "big", _records(0, total)).accepted == total
        # As big as the timed cycles, so the warm-up takes their path (a Spark job above
        # small_cycles.max_messages) and the first timed cycle is not charged with starting it.
        assert enqueue(declaration, "warmup", _records(0, total)).accepted == total
        seeded = enqueues - real
        started = time.perf_counter()
        if seeded:
            first = _timed_enqueues(declaration, "fresh", 0, real, size)
            seed_enqueues(declaration, "small", [[json.dumps(r) for r in _records(e * size, size)]
                                                 for e in range(seeded)], workdir)
            differences = _seed_differences(declaration, min(real, seeded))
            last = _timed_enqueues(declaration, "small", seeded, real, size)
        else:
            spent = _timed_enqueues(declaration, "small", 0, enqueues, size)
            first, last, differences = spent[:100], spent[-100:], []
        filling = time.perf_counter() - started
        shutil.copytree(lake / "small", lake / "tidy")
        checkpoints = len(list((lake / "small" / "inbound" / "_delta_log").glob("*.checkpoint*.parquet")))

        spark = build_session(SparkSettings(config={"spark.ui.showConsoleProgress": "false"}))
        spark.sparkContext.setLogLevel("ERROR")
        try:
            run_cycle(spark, declaration, "warmup", "inbound", run_id="warmup")
            big = _timed_cycle(spark, declaration, "big")
            small = _timed_cycle(spark, declaration, "small") if unmaintained else None
            started = time.perf_counter()
            maintained = maintain(declaration, "tidy")
            maintenance = time.perf_counter() - started
            tidy = _timed_cycle(spark, declaration, "tidy")
        finally:
            spark.stop()
        files = {t.table: [t.files_before, t.files_after] for t in maintained.tables if t.files_before > 1}
        return {
            "benchmark": "small_enqueues",
            "enqueues": enqueues,
            "size": size,
            "real_enqueues": min(enqueues, real if seeded else enqueues),
            "seeded_enqueues": seeded,
            "seed_differences": differences,
            "seconds": {"cycle_after_one_enqueue": round(big, 2),
                        "cycle_after_small_enqueues": round(small, 2) if small is not None else None,
                        "maintenance": round(maintenance, 2), "cycle_after_maintenance": round(tidy, 2),
                        "filling_small": round(filling, 1)},
            "ratio_maintained": round(tidy / big, 2),
            "ratio_without_maintenance": round(small / big, 2) if small is not None else None,
            "target_ratio": TARGET_RATIO,
            "within_target": tidy / big <= TARGET_RATIO and not differences,
            # first: the first enqueues of a fresh queue; last: the last ones, on a log `enqueues` long.
            "small_enqueue_ms": {"first": round(1000 * statistics.mean(first), 1),
                                 "last": round(1000 * statistics.mean(last), 1), "count_each": len(last)},
            "inbound_checkpoints_written_by_delta_rs": checkpoints,
            "files_before_after_maintenance": files,
            "cpus": os.cpu_count(),
            "load_avg": {"start": load_start, "end": os.getloadavg()},
        }
    return compute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--enqueues", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=10)
    parser.add_argument("--real", type=int, default=100,
                        help="real enqueues at the end (and into a fresh queue); the others are seeded. "
                             "Equal to --enqueues: every one real, none seeded")
    parser.add_argument("--no-unmaintained", dest="unmaintained", action="store_false",
                        help="do not time the cycle over the small files before maintenance")
    parser.add_argument("--quick", action="store_true", help="500 enqueues of 10 (CI: asserts nothing about time)")
    parser.add_argument("--workdir", help="keep the lakes here")
    args = parser.parse_args()
    enqueues = 500 if args.quick else args.enqueues
    if not 0 < args.real <= enqueues or args.size < 1:
        parser.error(f"--real {args.real} must be between 1 and --enqueues ({enqueues}), --size at least 1")
    return emit(measure(enqueues, args.size, args.real, args.unmaintained), args.workdir, "small-enqueues-")


if __name__ == "__main__":
    raise SystemExit(main())
