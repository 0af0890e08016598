"""Driver memory against batch size: the peak RSS of a cycle's driver, its Python process and its
JVM, for a small and a 4x bigger inbound cycle, each in a fresh process (issue 10, item 6).

    .venv/bin/python benchmarks/driver_memory.py [--quick] [--messages N] [--factor F] [--master URL]
                                                 [--workdir DIR]

For N and F*N messages (200-byte JSON, 1% poison, 0.5% transient; 1,000,000 and 4,000,000 by
default, 20,000 and 80,000 with --quick), this process writes the inbound table of a fresh
queue, then a fresh Python process starts Spark, runs one `run_cycle` and reads the peak resident
set (VmHWM in /proc) of itself and of its JVM. The ratio is the big cycle's sum over the small one's.

Prints one JSON line on stdout; everything else (Spark's logs included) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Importing cycle_throughput also puts this folder on PYTHONPATH for Spark's Python workers.
import bench_handler  # noqa: E402
import cycle_throughput as ct  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402

TARGET_RATIO = 1.5
# Written in commits of this many messages: the writing process never holds a whole big batch.
CHUNK = 500_000


def declaration_of(workdir: str, queue: str) -> Declaration:
    return parse_declaration({"lake_root": os.path.join(workdir, "lake"),
                              "queues": {queue: {"handler": bench_handler.HANDLER, "policy": ct.POLICY}}})


def peak_rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def cycle_child(workdir: str, queue: str, master: str) -> dict[str, Any]:
    """One cycle in this fresh process; the peaks of this process and of its JVM."""
    spark = build_session(SparkSettings(master=master, app_name="driver_memory"))
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    try:
        started = time.perf_counter()
        report = run_cycle(spark, declaration_of(workdir, queue), queue, "inbound", run_id=queue)
        seconds = time.perf_counter() - started
        python_mb, jvm_mb = peak_rss_mb(), peak_rss_mb(jvm)
        with open(f"/proc/{jvm}/comm") as comm:
            if comm.read().strip() != "java":
                raise RuntimeError(f"process {jvm} is not Spark's JVM")
    finally:
        spark.stop()
    return {"seconds": round(seconds, 2), "python_mb": round(python_mb, 1), "jvm_mb": round(jvm_mb, 1),
            "total_mb": round(python_mb + jvm_mb, 1), "counts": {k: int(v) for k, v in report.counts.items()}}


def measure(workdir: str, messages: int, master: str) -> dict[str, Any]:
    queue = f"q{messages}"
    declaration = declaration_of(workdir, queue)
    now = datetime.now(UTC)
    for start in range(0, messages, CHUNK):
        ct.write_inbound(declaration, queue, ct.message_table(min(CHUNK, messages - start), now, f"m{start}"))
    done = subprocess.run([sys.executable, __file__, "--child", queue, "--workdir", workdir, "--master", master],
                          stdout=subprocess.PIPE, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["counts"].get("messages") != messages:
        raise AssertionError(f"the cycle of {messages} messages counted {result['counts']}")
    print(f"{messages} messages: {result}", file=sys.stderr)
    return result


def run(messages: int, factor: int, master: str, workdir: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    small = measure(workdir, messages, master)
    big = measure(workdir, messages * factor, master)
    ratio = big["total_mb"] / small["total_mb"]
    return {
        "benchmark": "driver_memory",
        "messages": [messages, messages * factor],
        "small": small,
        "big": big,
        "ratio": round(ratio, 3),
        "python_ratio": round(big["python_mb"] / small["python_mb"], 3),
        "jvm_ratio": round(big["jvm_mb"] / small["jvm_mb"], 3),
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 and 80,000 messages (asserts nothing about time)")
    parser.add_argument("--messages", type=int, default=None, help="the small cycle (default 1,000,000)")
    parser.add_argument("--factor", type=int, default=4, help="the big cycle is this many times the small one")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--workdir", default=None, help="where the lake goes (default: a temporary folder)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        # The JVM writes to file descriptor 1 too: only the result line may reach the parent's pipe.
        stdout = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        stdout.write(json.dumps(cycle_child(args.workdir, args.child, args.master)) + "\n")
        stdout.flush()
        return 0
    messages = args.messages or (20_000 if args.quick else 1_000_000)
    if messages < 1 or args.factor < 2:
        parser.error("--messages must be at least 1 and --factor at least 2")
    return ct.emit(lambda workdir: run(messages, args.factor, args.master, workdir), args.workdir, "driver_memory-")


if __name__ == "__main__":
    sys.exit(main())
