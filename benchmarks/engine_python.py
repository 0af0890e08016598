"""The executor-side Python of a big cycle, per message, against the floor's, in one process (no Spark).

    .venv/bin/python benchmarks/engine_python.py [--messages N | --quick] [--rounds R]

Spark's Python workers set the pace of a big cycle's delivery job, so this times what they run on
`cycle_throughput.py`'s messages (1% poison, 0.5% transient), in Arrow batches of 10,000 as Spark
hands them over: the engine's `Processor` (conversion, delivery, routes, the staged batch) and the
floor's `plain_pass`, each with the garbage collector on and off (the best of R rounds), and how many
collections of each generation the engine's pass caused per 1,000 messages.

Prints one JSON line; `engine_commit` is the commit of the `poison_pipeline` package it imported.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

import poison_pipeline
from poison_pipeline.domain.declaration import parse_declaration
from poison_pipeline.engine.batch import CycleSpec, Processor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_handler  # noqa: E402
import cycle_throughput  # noqa: E402

BATCH_ROWS = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch
QUICK_MESSAGES = 20_000

Pass = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _engine_commit() -> str | None:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(poison_pipeline.__file__).parent,
                           capture_output=True, text=True)
    return found.stdout.strip() or None


def _seconds(function: Pass, batches: list[pa.RecordBatch]) -> float:
    started = time.perf_counter()
    for _ in function(iter(batches)):
        pass
    return time.perf_counter() - started


def _collections(function: Pass, batches: list[pa.RecordBatch]) -> Counter[int]:
    counted: Counter[int] = Counter()

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            counted[info["generation"]] += 1

    gc.callbacks.append(count)
    try:
        _seconds(function, batches)
    finally:
        gc.callbacks.remove(count)
    return counted


def run(messages: int, rounds: int) -> dict[str, Any]:
    now = datetime.now(UTC)
    declaration = parse_declaration({"lake_root": str(HERE / "unused-lake"), "queues": {
        bench_handler.QUEUE: {"handler": bench_handler.HANDLER, "policy": cycle_throughput.POLICY}}})
    queue = declaration.queue(bench_handler.QUEUE)
    spec = CycleSpec(bench_handler.QUEUE, "inbound", queue.policy, queue.poison_queue, queue.handler, now,
                     "inbound-1-bench", storage_options=dict(declaration.storage_options))
    table = cycle_throughput.message_table(messages, now, "m")
    passes: dict[str, tuple[Callable[[], Pass], list[pa.RecordBatch]]] = {
        "engine": (lambda: Processor(spec), table.to_batches(max_chunksize=BATCH_ROWS)),
        "floor": (lambda: bench_handler.plain_pass,
                  table.select(bench_handler.ENVELOPE_COLUMNS).to_batches(max_chunksize=BATCH_ROWS)),
    }
    result: dict[str, Any] = {"benchmark": "engine_python", "messages": messages, "rounds": rounds,
                              "engine_commit": _engine_commit()}
    for name, (make, batches) in passes.items():
        _seconds(make(), batches)  # imports, pyarrow kernels, the handler's first calls
        for collector in ("gc_on", "gc_off"):
            (gc.enable if collector == "gc_on" else gc.disable)()
            best = min(_seconds(make(), batches) for _ in range(rounds))
            result[f"{name}_us_per_msg_{collector}"] = round(best / messages * 1e6, 2)
        gc.enable()
    counted = _collections(passes["engine"][0](), passes["engine"][1])
    result["engine_collections_per_1000_msgs"] = {str(g): round(counted[g] / messages * 1000, 2) for g in range(3)}
    result["engine_over_floor_gc_on"] = round(result["engine_us_per_msg_gc_on"] / result["floor_us_per_msg_gc_on"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--messages", type=int, default=200_000)
    size.add_argument("--quick", action="store_true", help=f"{QUICK_MESSAGES:,} messages")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(QUICK_MESSAGES if args.quick else args.messages, args.rounds)))


if __name__ == "__main__":
    main()
