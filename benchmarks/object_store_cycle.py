"""A big inbound cycle with its lake on an object store that adds latency to every request, against
the same cycle on a local lake.

    .venv/bin/python benchmarks/object_store_cycle.py [--messages N | --quick] [--delay-ms D]

Seeds three queues with the same N messages (cycle_throughput's: 200-byte JSON bodies, 1% poison,
0.5% transient): two in a local lake, one written the same way and uploaded to an S3-compatible
server (moto's, on 127.0.0.1) that adds D ms to every request (an S3 in the same region adds about
20 ms). Then, in one Spark session, after a warm-up cycle on each lake: the local cycle, the cycle
on the store, the other local cycle. The ratio compares the store's cycle with the mean of the two
local ones, so that the order favours neither side. The Spark tasks read the due files and write
their staged results through Arrow on both lakes.

Prints one JSON line; target: the cycle on the store at most 1.3 times the local one.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import bench_handler  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402
from cycle_throughput import POLICY, emit, seed, timed, warmup_size  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.storage.uri import fs_of  # noqa: E402
from poison_pipeline_tests import s3_support  # noqa: E402

TARGET_RATIO = 1.3
QUICK_MESSAGES = 20_000
QUEUES = ("local_before", "stored", "local_after")


def _declaration(root: str, options: dict[str, str]) -> Declaration:
    return parse_declaration({
        "lake_root": root, "storage_options": options, "lease": {"wait": "60s", "expiry": "30s"},
        "queues": {name: {"handler": bench_handler.HANDLER, "policy": POLICY} for name in (*QUEUES, "warmup")}})


def run(messages: int, delay_ms: float, workdir: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    now = datetime.now(UTC)
    local = _declaration(os.path.join(workdir, "lake"), {})
    staged = _declaration(os.path.join(workdir, "upload"), {})
    for queue in ("local_before", "local_after", "warmup"):
        seed(local, queue, warmup_size(messages) if queue == "warmup" else messages, now)
    seed(staged, "stored", messages, now)
    seed(staged, "warmup", warmup_size(messages), now)
    server = s3_support.serve(log=os.path.join(workdir, "requests.log"), delay_ms=delay_ms)
    options = next(server)
    try:
        stored = _declaration(s3_support.fresh_root("cycle"), options)
        fs, path = fs_of(stored.lake_root, options)
        upload, _ = timed(lambda: pafs.copy_files(os.path.join(workdir, "upload"), path,
                                                  destination_filesystem=fs, use_threads=True))
        print(f"uploaded in {upload:.1f}s", file=sys.stderr)
        spark = build_session(SparkSettings(app_name="object_store_cycle",
                                            config={"spark.ui.showConsoleProgress": "false"}))
        spark.sparkContext.setLogLevel("ERROR")
        try:
            run_cycle(spark, local, "warmup", "inbound", now=now, run_id="warmup")
            run_cycle(spark, stored, "warmup", "inbound", now=now, run_id="warmup")
            seconds = {}
            for queue in QUEUES:
                declaration = stored if queue == "stored" else local
                seconds[queue], report = timed(
                    functools.partial(run_cycle, spark, declaration, queue, "inbound", now=now, run_id="bench"))
                assert report.counts.get("messages") == messages, report.counts
        finally:
            spark.stop()
    finally:
        for _ in server:
            pass
    local_seconds = statistics.mean([seconds["local_before"], seconds["local_after"]])
    ratio = seconds["stored"] / local_seconds
    return {
        "benchmark": "object_store_cycle",
        "messages": messages,
        "delay_ms": delay_ms,
        "local_seconds": round(local_seconds, 2),
        "local_runs_seconds": [round(seconds["local_before"], 2), round(seconds["local_after"], 2)],
        "store_seconds": round(seconds["stored"], 2),
        "store_over_local": round(ratio, 3),
        "target": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added to every request to the store")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_MESSAGES:,} messages (CI: checks that it runs, says nothing of speed)")
    args = parser.parse_args(argv)
    messages = QUICK_MESSAGES if args.quick else args.messages
    if messages < 1:
        parser.error("--messages must be at least 1")
    if args.delay_ms < 0:
        parser.error("--delay-ms must be 0 or more")
    return emit(lambda workdir: run(messages, args.delay_ms, workdir), None, "object_store_cycle-")


if __name__ == "__main__":
    sys.exit(main())
