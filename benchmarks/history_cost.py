"""Cost of history: an inbound cycle on a queue with years of ledgers against the same cycle on a
fresh queue (issue 10, item 4).

    .venv/bin/python benchmarks/history_cost.py [--quick] [--messages N] [--processed P]
                                                [--attempts A] [--rounds R] [--master URL] [--workdir DIR]

Seeds the `processed` ledger of one queue with P rows inside its 7-day dedup window and its
`attempts` ledger with A rows, in commits of the size a cycle of N messages makes (one per
cycle, spread over the window's days), as the engine writes them (with their id hashes). Then, R
rounds: N fresh messages (200-byte JSON, 1% poison, 0.5% transient; on the history queue 10 of them
redeliveries of processed ids) go to the inbound table of each queue and one `run_cycle` of each is
timed, alternating which runs first. The ratio is the median history cycle over the median fresh one.

Prints one JSON line on stdout; everything else (Spark's logs included) goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Importing cycle_throughput also puts this folder on PYTHONPATH for Spark's Python workers.
import bench_handler  # noqa: E402
import cycle_throughput as ct  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.domain.routing import PROCESSED  # noqa: E402
from poison_pipeline.engine.dedup import id_hashes  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.operations.maintenance import maintain  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables  # noqa: E402
from poison_pipeline.storage.writer import queue_writer  # noqa: E402

TARGET_RATIO = 1.3
WINDOW_DAYS = 7
REDELIVERED = 10
FULL = {"messages": 10_000, "processed": 10_000_000, "attempts": 20_000_000, "rounds": 5}
QUICK = {"messages": 2_000, "processed": 200_000, "attempts": 400_000, "rounds": 3}


def _column(rows: int, value: object, type_: pa.DataType) -> pa.Array:
    return pa.array([value] * rows, type_)


def processed_commit(seq: int, rows: int, at: datetime) -> pa.Table:
    ids = [f"h{seq:06d}-{i:06d}" for i in range(rows)]
    columns = {
        "message_id": pa.array(ids, pa.string()),
        "message_type": _column(rows, "bench.order", pa.string()),
        "disposition": _column(rows, "processed", pa.string()),
        "from_table": _column(rows, "inbound", pa.string()),
        "batch_id": _column(rows, f"enq-{seq}", pa.string()),
        "total_abort_count": _column(rows, 0, pa.int32()),
        "move_count": _column(rows, 0, pa.int32()),
        "at": _column(rows, at, schemas.TS),
        "date": _column(rows, at.date().isoformat(), pa.string()),
        "cycle_seq": _column(rows, seq, pa.int64()),
        "id_hash": id_hashes(ids),
    }
    return pa.Table.from_arrays([columns.get(f.name, pa.nulls(rows, f.type)) for f in schemas.PROCESSED],
                                schema=schemas.PROCESSED)


def attempts_commit(seq: int, rows: int, at: datetime) -> pa.Table:
    columns = {
        "message_id": pa.array([f"h{seq:06d}-{i // 2:06d}" for i in range(rows)], pa.string()),
        "table": _column(rows, "inbound", pa.string()),
        "cycle": _column(rows, 0, pa.int32()),
        "attempt": pa.array([1 + i % 2 for i in range(rows)], pa.int32()),
        "started_at": _column(rows, at, schemas.TS),
        "duration_ms": _column(rows, 0.05, pa.float64()),
        "outcome": pa.array(["abort" if i % 2 == 0 else "success" for i in range(rows)], pa.string()),
        "error_type": pa.array(["Deadlock" if i % 2 == 0 else None for i in range(rows)], pa.string()),
        "run_id": _column(rows, f"run-{seq}", pa.string()),
        "cycle_seq": _column(rows, seq, pa.int64()),
        "date": _column(rows, at.date().isoformat(), pa.string()),
    }
    return pa.Table.from_arrays([columns.get(f.name, pa.nulls(rows, f.type)) for f in schemas.ATTEMPTS],
                                schema=schemas.ATTEMPTS)


def seed_history(tables: QueueTables, processed: int, attempts: int, per_cycle: int, now: datetime) -> int:
    """Commit the ledgers as cycles of `per_cycle` messages would, over the window's days; return
    the number of cycles (commits per ledger)."""
    cycles = max(1, -(-processed // per_cycle))
    per_attempts = -(-attempts // cycles)
    with queue_writer(tables, "benchmark") as writer:
        for seq in range(cycles):
            # Oldest first, the newest on today: every row inside the window.
            at = now - timedelta(days=(WINDOW_DAYS - 1) * (cycles - 1 - seq) / max(1, cycles - 1))
            writer.append(PROCESSED, processed_commit(seq, min(per_cycle, processed - seq * per_cycle), at))
            writer.append(ATTEMPTS, attempts_commit(seq, min(per_attempts, attempts - seq * per_attempts), at))
    return cycles


def open_seconds(tables: QueueTables, table: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        tables.open(table).version()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    queue = {"handler": bench_handler.HANDLER, "policy": {**ct.POLICY, "dedup_window": f"{WINDOW_DAYS}d"}}
    declaration: Declaration = parse_declaration(
        {"lake_root": os.path.join(workdir, "lake"), "queues": {"history": queue, "fresh": queue, "warmup": queue}})
    history = QueueTables.of(declaration, "history")
    now = datetime.now(UTC)
    started = time.perf_counter()
    if history.exists(PROCESSED):
        # A kept --workdir: its history is measured again (seeding 30M rows takes minutes).
        cycles = history.open(PROCESSED).version()
        print(f"reusing the history of {history.uri(PROCESSED)}", file=sys.stderr)
    else:
        history.ensure()
        cycles = seed_history(history, args.processed, args.attempts, args.messages, now)
    seed_s = time.perf_counter() - started
    print(f"seeded {args.processed} processed and {args.attempts} attempts rows in {cycles} commits each "
          f"in {seed_s:.1f}s", file=sys.stderr)
    maintain_s = None
    if args.maintain:
        # What the queue's maintenance job does between cycles: compacts the ledgers' small files.
        clock = time.perf_counter()
        maintain(declaration, "history", vacuum=False)
        maintain_s = round(time.perf_counter() - clock, 1)
        print(f"maintained the history queue in {maintain_s}s", file=sys.stderr)
    # Ids no earlier run in a kept workdir used: only the redelivered ones are duplicates.
    tag = now.strftime("%H%M%S")

    spark = build_session(SparkSettings(master=args.master, app_name="history_cost"))
    spark.sparkContext.setLogLevel("ERROR")
    seconds: dict[str, list[float]] = {"history": [], "fresh": []}
    counts: dict[str, dict[str, float]] = {}
    try:
        ct.write_inbound(declaration, "warmup", ct.message_table(args.messages, now, f"warm{tag}"))
        run_cycle(spark, declaration, "warmup", "inbound", run_id="warmup")
        for r in range(args.rounds):
            batch = ct.message_table(args.messages, now, f"{tag}r{r}")
            ct.write_inbound(declaration, "fresh", batch)
            redelivered = pa.array([f"h{r:06d}-{i:06d}" for i in range(REDELIVERED)], pa.string())
            ids = pa.concat_arrays([redelivered, batch["message_id"].combine_chunks()[REDELIVERED:]])
            ct.write_inbound(declaration, "history", batch.set_column(0, "message_id", ids))
            for name in (("history", "fresh") if r % 2 == 0 else ("fresh", "history")):
                started = time.perf_counter()
                report = run_cycle(spark, declaration, name, "inbound", run_id=f"{name}-{r}")
                seconds[name].append(time.perf_counter() - started)
                counts[name] = report.counts
                print(f"round {r} {name}: {seconds[name][-1]:.2f}s {report.counts}", file=sys.stderr)
    finally:
        spark.stop()
    if counts["history"].get("duplicate") != REDELIVERED or counts["fresh"].get("duplicate"):
        raise AssertionError(f"dedup counted wrong: {counts}")
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    ratio = medians["history"] / medians["fresh"]
    fresh = QueueTables.of(declaration, "fresh")
    return {
        "benchmark": "history_cost",
        "messages": args.messages,
        "processed_rows": args.processed,
        "attempts_rows": args.attempts,
        "ledger_commits": cycles,
        "rounds": args.rounds,
        "history_s": [round(s, 3) for s in seconds["history"]],
        "fresh_s": [round(s, 3) for s in seconds["fresh"]],
        "history_median_s": round(medians["history"], 3),
        "fresh_median_s": round(medians["fresh"], 3),
        "ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "open_s": {"history_processed": round(open_seconds(history, PROCESSED), 4),
                   "history_attempts": round(open_seconds(history, ATTEMPTS), 4),
                   "fresh_processed": round(open_seconds(fresh, PROCESSED), 4),
                   "fresh_attempts": round(open_seconds(fresh, ATTEMPTS), 4)},
        "seed_s": round(seed_s, 1),
        "maintained": args.maintain,
        "maintain_s": maintain_s,
        "ledger_files": {"processed": len(history.open(PROCESSED).file_uris()),
                         "attempts": len(history.open(ATTEMPTS).file_uris())},
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for CI (asserts nothing about time)")
    parser.add_argument("--messages", type=int)
    parser.add_argument("--processed", type=int)
    parser.add_argument("--attempts", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--maintain", action="store_true",
                        help="run the queue's maintenance (compaction, checkpoints) on the history before timing")
    parser.add_argument("--workdir", default=None,
                        help="where the lake goes (default: a temporary folder, removed after)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.messages <= REDELIVERED or args.processed < args.messages or args.attempts < 0 or args.rounds < 1:
        parser.error(f"--messages must exceed {REDELIVERED}, --processed be at least --messages, "
                     "--attempts at least 0 and --rounds at least 1")
    return ct.emit(lambda workdir: run(args, workdir), args.workdir, "history_cost-")


if __name__ == "__main__":
    sys.exit(main())
