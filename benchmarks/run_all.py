"""Every benchmark, each in a fresh process: `make bench` (full sizes, one after the other, so no
benchmark's figures share the machine with another's) and `make bench-quick` (small sizes, for CI: it
checks that every benchmark still runs and prints its line, and asserts nothing about time; two run
at a time, `--jobs`, each on servers and ports of its own).

    .venv/bin/python benchmarks/run_all.py [--quick] [--jobs N] [--only NAME ...] [--args "ARGS"]

Prints each benchmark's JSON line on stdout as it finishes, with `load_avg_before`, `git_commit`,
`at` and `quick` added. A full run also appends each line to `benchmarks/results/<name>.jsonl`, the
raw record the figures of `benchmarks/README.md` are quoted from. Exits 1 if any benchmark failed to
run or printed no JSON line; a target missed is reported (`within_target`) but is not a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)


# In the order of issue 10's targets, then the older ones. `quick` sizes finish in well under a minute.
BENCHMARKS = (
    Benchmark("cycle_throughput"),
    Benchmark("engine_python"),
    Benchmark("small_cycle"),
    Benchmark("connect_run"),
    Benchmark("enqueue_throughput"),
    Benchmark("small_enqueues"),
    Benchmark("history_cost"),
    Benchmark("sensors_scale"),
    Benchmark("driver_memory"),
    Benchmark("broker_drain"),
    Benchmark("checks_cost", quick=("--messages", "50000", "--files", "20", "--failed", "1000", "--rounds", "3")),
    Benchmark("failure_metadata", quick=("--messages", "10000", "--commits", "5", "--rounds", "5",
                                         "--events", "20")),
    Benchmark("lease_overhead", quick=("--rounds", "20")),
    Benchmark("ordering_cost", quick=("--messages", "10000", "--conversations", "250", "--rounds", "1")),
    Benchmark("redrive_backfill", quick=("--days", "3", "--per-day", "100", "--rounds", "1")),
    Benchmark("lake_reader"),
    # Seeded by real enqueues (about 4 s each against the local S3 server): 150 commits, not 10,000.
    Benchmark("object_store_cost", full=("--commits", "150")),
    Benchmark("object_store_cycle"),
    Benchmark("latency"),
    Benchmark("simulate_cost"),
    # A long history is built one commit at a time and slows as its files add up: 2,000 commits here.
    Benchmark("one_log_race", full=("--history", "2000")),
)


def _commit() -> str | None:
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    return found.stdout.strip() or None


def run_one(benchmark: Benchmark, quick: bool, extra: tuple[str, ...] = ()) -> dict[str, object] | None:
    """Run one benchmark script; its JSON line with the run's context, or None if it failed."""
    args = (*(benchmark.quick if quick else benchmark.full), *extra)
    load = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(HERE / f"{benchmark.name}.py"), *args],
                          stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip().startswith("{")]
    if done.returncode != 0 or not lines:
        print(f"FAILED {benchmark.name} (exit {done.returncode}, {len(lines)} JSON line(s))", file=sys.stderr)
        return None
    result = json.loads(lines[-1])
    result.setdefault("benchmark", benchmark.name)
    result.update({"load_avg_before": [round(x, 2) for x in load], "git_commit": _commit(), "quick": quick,
                   "at": datetime.now(UTC).isoformat(timespec="seconds"),
                   "wall_seconds": round(time.perf_counter() - started, 1)})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI): runs everything, times nothing")
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME",
                        help=f"run only these: {', '.join(b.name for b in BENCHMARKS)}")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="benchmarks running at a time: 2 with --quick, else 1 (a full run's figures are timed)")
    parser.add_argument("--args", default="", metavar="ARGS",
                        help="more arguments for the one benchmark --only names (e.g. --args=--phases)")
    args = parser.parse_args(argv)
    extra = tuple(shlex.split(args.args))
    if extra and len(args.only or ()) != 1:
        parser.error("--args needs --only with exactly one benchmark: arguments differ between benchmarks")
    known = {b.name for b in BENCHMARKS}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    jobs = args.jobs if args.jobs is not None else (2 if args.quick else 1)
    if jobs < 1:
        parser.error("--jobs must be at least 1")
    chosen = [b for b in BENCHMARKS if args.only is None or b.name in args.only]
    failed = []

    def one(benchmark: Benchmark) -> None:
        print(f"--- {benchmark.name}{' (quick)' if args.quick else ''}", file=sys.stderr, flush=True)
        result = run_one(benchmark, args.quick, extra)
        if result is None:
            failed.append(benchmark.name)
            return
        line = json.dumps(result)
        print(line, flush=True)
        if not args.quick:
            with open(HERE / "results" / f"{benchmark.name}.jsonl", "a") as out:
                out.write(line + "\n")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, chosen))
    if failed:
        print(f"{len(failed)} benchmark(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
