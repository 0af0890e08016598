"""Cost of `simulate`: a candidate policy replayed over 1,000,000 recorded attempts, without Spark.

    .venv/bin/python benchmarks/simulate_cost.py [--quick] [--attempts A] [--failing-share F]
                                                 [--rounds R] [--workdir DIR]

Seeds one queue's ledgers as its cycles would have left them: A attempts, of which a share F belongs
to messages that failed (four attempts each: two per cycle, two cycles, then the poison queue, with
four distinct errors), the rest to messages processed at their first attempt; the processed ledger
and the poison table hold where they went. Then R rounds of `simulate` under a candidate policy that
changes the fate of every failing message (more attempts, a back-off, a rule), timed whole (opening
the tables, reading, replaying, grouping). The baseline is the least any such report must do: read
the same attempts columns from the ledger and count attempts per message (pyarrow's group-by).
Target: 5 s for 1,000,000 attempts.

Prints one JSON line on stdout; everything else goes to stderr.
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
import pyarrow.compute as pc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_handler  # noqa: E402
import cycle_throughput as ct  # noqa: E402

from poison_pipeline.domain.declaration import parse_declaration  # noqa: E402
from poison_pipeline.domain.policy import Policy  # noqa: E402
from poison_pipeline.domain.routing import POISON, PROCESSED  # noqa: E402
from poison_pipeline.operations.simulate import simulate  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables  # noqa: E402
from poison_pipeline.storage.writer import queue_writer  # noqa: E402

TARGET_S = 5.0
FULL = {"attempts": 1_000_000, "rounds": 3}
QUICK = {"attempts": 20_000, "rounds": 1}
RECORDED = {"receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0, "receive_error_handling": "move"}
CANDIDATE = {"receive_retry_count": 3, "max_retry_cycles": 1, "receive_error_handling": "reject",
             "backoff": {"initial": "1m", "multiplier": 2, "jitter": "full"},
             "rules": [{"exceptions": ["LookupError"], "receive_retry_count": 0, "max_retry_cycles": 0}]}
ERRORS = [("ValueError", "bad payload"), ("KeyError", "unknown sku"), ("LookupError", "no profile"),
          ("TimeoutError", "slow service")]


def _table(schema: pa.Schema, rows: int, columns: dict[str, Any]) -> pa.Table:
    return pa.Table.from_arrays(
        [columns[f.name] if f.name in columns else pa.nulls(rows, f.type) for f in schema], schema=schema)


def seed(tables: QueueTables, attempts: int, failing_share: float, now: datetime) -> tuple[int, int]:
    """The ledgers of `attempts` attempts; returns (messages processed at once, messages that failed)."""
    failing = int(attempts * failing_share) // 4
    succeeded = attempts - 4 * failing
    ok_ids = [f"ok-{i:07d}" for i in range(succeeded)]
    bad_ids = [f"bad-{i:07d}" for i in range(failing)]
    at = pa.scalar(now - timedelta(hours=1), schemas.TS)
    ids = ok_ids + [m for m in bad_ids for _ in range(4)]
    rows = len(ids)
    kinds = [ERRORS[i % len(ERRORS)] for i in range(failing)]
    attempt_columns = {
        "message_id": pa.array(ids, pa.string()),
        "table": pa.array(["inbound"] * succeeded + ["inbound", "inbound", "retry_1", "retry_1"] * failing),
        "cycle": pa.array([0] * succeeded + [0, 0, 1, 1] * failing, pa.int32()),
        "attempt": pa.array([1] * succeeded + [1, 2, 1, 2] * failing, pa.int32()),
        "started_at": pa.repeat(at, rows),
        "duration_ms": pa.repeat(pa.scalar(2.0), rows),
        "outcome": pa.array(["success"] * succeeded + ["abort"] * (4 * failing)),
        "error_type": pa.array([None] * succeeded + [k[0] for k in kinds for _ in range(4)], pa.string()),
        "error_message": pa.array([None] * succeeded + [k[1] for k in kinds for _ in range(4)], pa.string()),
        "error_signature": pa.array([None] * succeeded + [f"{i % 4:016x}" for i in range(failing) for _ in range(4)],
                                    pa.string()),
        "run_id": pa.repeat(pa.scalar("seed"), rows),
        "cycle_seq": pa.array([1] * succeeded + [1, 1, 2, 2] * failing, pa.int64()),
        "date": pa.repeat(pa.scalar(now.date().isoformat()), rows),
    }
    processed = _table(schemas.PROCESSED, succeeded, {
        "message_id": pa.array(ok_ids, pa.string()), "message_type": pa.repeat(pa.scalar("order"), succeeded),
        "disposition": pa.repeat(pa.scalar("processed"), succeeded),
        "from_table": pa.repeat(pa.scalar("inbound"), succeeded), "at": pa.repeat(at, succeeded),
        "date": pa.repeat(pa.scalar(now.date().isoformat()), succeeded),
        "id_hash": pa.array(range(succeeded), pa.int64())})
    poisoned = _table(schemas.MESSAGE, failing, {
        "message_id": pa.array(bad_ids, pa.string()), "message_type": pa.repeat(pa.scalar("order"), failing),
        "entered_at": pa.repeat(at, failing), "due_at": pa.repeat(at, failing),
        "enqueued_at": pa.repeat(at, failing), "batch_id": pa.repeat(pa.scalar("seed"), failing)})
    with queue_writer(tables, "benchmark") as writer:
        writer.append(ATTEMPTS, _table(schemas.ATTEMPTS, rows, attempt_columns))
        writer.append(PROCESSED, processed)
        writer.append(POISON, poisoned)
    return succeeded, failing


def baseline(tables: QueueTables) -> float:
    """Read the attempts columns a replay reads and count attempts per message."""
    started = time.perf_counter()
    read = tables.open(ATTEMPTS).to_pyarrow_dataset().to_table(
        columns=["message_id", "table", "cycle", "attempt", "started_at", "cycle_seq", "duration_ms", "outcome",
                 "error_type", "error_code", "error_signature"])
    counted = read.group_by("message_id", use_threads=False).aggregate([([], "count_all")])
    assert pc.sum(counted["count_all"]).as_py() == read.num_rows
    return time.perf_counter() - started


def run(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    declaration = parse_declaration({"lake_root": os.path.join(workdir, "lake"), "queues": {
        "q": {"handler": bench_handler.HANDLER, "policy": RECORDED}}})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    started = time.perf_counter()
    succeeded, failing = seed(tables, args.attempts, args.failing_share, datetime.now(UTC))
    seed_s = time.perf_counter() - started
    print(f"seeded {args.attempts} attempts ({succeeded} messages at once, {failing} failing) in {seed_s:.1f}s",
          file=sys.stderr)
    candidate = Policy.model_validate(CANDIDATE)
    actual = declaration.queue("q").policy
    same = simulate(declaration, "q", actual)
    if same.changed or same.simulated != same.recorded:
        raise AssertionError(f"the recorded policy does not reproduce the record: {same.simulated} {same.recorded}")
    seconds, base = [], []
    for r in range(args.rounds):
        base.append(baseline(tables))
        began = time.perf_counter()
        found = simulate(declaration, "q", candidate)
        seconds.append(time.perf_counter() - began)
        print(f"round {r}: simulate {seconds[-1]:.2f}s, baseline {base[-1]:.2f}s, {found.simulated}", file=sys.stderr)
    if found.attempts != args.attempts or found.changed != failing:
        raise AssertionError(f"simulated {found.attempts} attempts, {found.changed} changed; expected {failing}")
    median, base_median = statistics.median(seconds), statistics.median(base)
    return {
        "benchmark": "simulate_cost",
        "attempts": found.attempts,
        "messages": found.messages,
        "failing_messages": failing,
        "rounds": args.rounds,
        "simulate_s": [round(s, 3) for s in seconds],
        "baseline_s": [round(s, 3) for s in base],
        "simulate_median_s": round(median, 3),
        "baseline_median_s": round(base_median, 3),
        "ratio": round(median / base_median, 2),
        "attempts_per_s": round(found.attempts / median),
        "target_s": TARGET_S,
        "within_target": median <= TARGET_S * max(1.0, found.attempts / 1_000_000),
        "simulated": found.simulated,
        "seed_s": round(seed_s, 1),
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for CI (asserts nothing about time)")
    parser.add_argument("--attempts", type=int)
    parser.add_argument("--failing-share", type=float, default=0.1,
                        help="the share of attempts made by messages that failed (default 0.1)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--workdir", default=None, help="where the lake goes (default: a temporary folder)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.attempts < 8 or not 0 < args.failing_share < 1 or args.rounds < 1:
        parser.error("--attempts must be at least 8, --failing-share between 0 and 1, --rounds at least 1")
    return ct.emit(lambda workdir: run(args, workdir), args.workdir, "simulate_cost-")


if __name__ == "__main__":
    sys.exit(main())
