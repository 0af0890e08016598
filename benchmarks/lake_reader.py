"""Which reader a big cycle should use on a local lake: Spark's own Parquet reader, or the Arrow
tasks that an object-store lake uses (engine/reading.py).

    .venv/bin/python benchmarks/lake_reader.py [--messages N | --quick] [--appends K] [--master URL]
                                               [--workdir DIR]

Writes N messages (as cycle_throughput: 200-byte JSON bodies, 1% poison, 0.5% transient) to the
inbound tables of four queues, in K commits each, then times one `run_cycle(..., "inbound")` of each
in one Spark session, every reader used for every read of the cycle (due messages, ledger): Spark's,
Arrow's, Arrow's, Spark's, so that the order favours neither. `arrow_over_spark` below 1 would
make Arrow tasks the better reader on a local lake too.

Prints one JSON line on stdout; everything else (Spark's logs included) goes to stderr.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Importing cycle_throughput also puts this folder on PYTHONPATH for Spark's Python workers, which
# import the handler (bench_handler) by name; it must happen before the session starts.
import bench_handler  # noqa: E402
import cycle_throughput as ct  # noqa: E402

from poison_pipeline.domain.declaration import SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine import cycle as cycle_module  # noqa: E402
from poison_pipeline.engine import dedup, ended, ordering, reading  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402

# Every module that reads lake files into Spark, as it imported the reader.
_READERS = (cycle_module, dedup, ended, ordering)
ORDER = (("spark", "spark_a"), ("arrow", "arrow_a"), ("arrow", "arrow_b"), ("spark", "spark_b"))


def _reader(arrow: bool) -> None:
    chosen = functools.partial(reading.read_files, arrow=arrow)
    for module in _READERS:
        module.read_files = chosen  # type: ignore[attr-defined]


def run(messages: int, appends: int, master: str, workdir: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    declaration = parse_declaration({
        "lake_root": os.path.join(workdir, "lake"),
        "queues": {queue: {"handler": bench_handler.HANDLER, "policy": ct.POLICY}
                   for queue in ("warmup_spark", "warmup_arrow", *(queue for _, queue in ORDER))}})
    now = datetime.now(UTC)
    files = 0
    for _, queue in ORDER:
        files = len(ct.seed(declaration, queue, messages, now, appends))
    for reader in ("spark", "arrow"):
        ct.seed(declaration, f"warmup_{reader}", ct.warmup_size(messages), now, 1)
    spark = build_session(SparkSettings(master=master, app_name="lake_reader",
                                        config={"spark.ui.showConsoleProgress": "false"}))
    spark.sparkContext.setLogLevel("ERROR")
    seconds: dict[str, list[float]] = {"spark": [], "arrow": []}
    counts = {}
    try:
        for reader in ("spark", "arrow"):  # each reader's code paths warm before any is timed
            _reader(reader == "arrow")
            ct.run_cycle(spark, declaration, f"warmup_{reader}", "inbound", now=now, run_id="warmup")
        for reader, queue in ORDER:
            _reader(reader == "arrow")
            (wall, _), report, _ = ct.timed_cycle(spark, declaration, queue, now, False)
            seconds[reader].append(wall)
            counts[queue] = {k: int(v) for k, v in report.counts.items()}
    finally:
        spark.stop()
    if len({tuple(sorted(c.items())) for c in counts.values()}) != 1:
        raise RuntimeError(f"the readers' cycles did not do the same work: {counts}")
    spark_mean, arrow_mean = (sum(seconds[r]) / len(seconds[r]) for r in ("spark", "arrow"))
    return {
        "benchmark": "lake_reader",
        "messages": messages,
        "appends": appends,
        "input_files": files,
        "master": master,
        "spark_reader_cycle_seconds": [round(s, 2) for s in seconds["spark"]],
        "arrow_reader_cycle_seconds": [round(s, 2) for s in seconds["arrow"]],
        "arrow_over_spark": round(arrow_mean / spark_mean, 3),
        "cycle_counts": counts["spark_a"],
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true",
                        help=f"{ct.QUICK_MESSAGES:,} messages (CI: checks that it runs)")
    parser.add_argument("--appends", type=int, default=1, help="commits (files) per inbound table (default 1)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--workdir", default=None,
                        help="where the lake goes (default: a temporary folder, removed after)")
    args = parser.parse_args(argv)
    messages = ct.QUICK_MESSAGES if args.quick else args.messages
    if messages < 1 or not 1 <= args.appends <= messages:
        parser.error("--messages must be at least 1, and --appends between 1 and --messages")
    return ct.emit(lambda workdir: run(messages, args.appends, args.master, workdir), args.workdir, "lake_reader-")


if __name__ == "__main__":
    sys.exit(main())
