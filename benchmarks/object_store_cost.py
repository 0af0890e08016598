"""What a lake on an object store costs, as requests: latency and price on S3 are per request.

    .venv/bin/python benchmarks/object_store_cost.py [--commits N | --quick]

Starts an S3-compatible server (moto's, on 127.0.0.1, stopped by its process id) and counts, in
its request log, every request any part of the product makes (delta-rs, pyarrow through
delta-rs's object_store). Then:

- seeds queue `q` with N enqueues of one message each, as real enqueues leave them (N commits and N
  files in its inbound log and N commits in its intake ledger, with the checkpoints delta-rs writes
  every 100 commits: `lake_seed.seed_enqueues` on a local folder, uploaded to the store; not counted);
- counts one idle evaluation of the inbound sensor (`decide` with the cursor of the evaluation before
  it: nothing changed since, a run already requested);
- counts each asset check's first evaluation on this machine and its next one, nothing changed
  between (`one_place` keeps what it read in this machine's cache directory);
- counts a 100-message inbound cycle (small path, no Spark) on a fresh queue, and one after
  `--prior-cycles` such cycles of that queue (its tables' logs as a working queue's are: commits
  since their last checkpoints).

- times 100-message cycles of a fresh queue on a second server that adds `--delay-ms` to every
  request (an S3 in the same region adds about 20 ms), and on one that adds nothing: the median of
  `--timed-cycles` cycles after the first (which creates the tables) of each.

Prints one JSON line; targets: an idle sensor evaluation at most 10 requests whatever N, a
100-message cycle at most 100 requests and at most 3 s with 20 ms added to each request. Any N
that is not a multiple of 100 leaves commits after the last checkpoint, which every load of the
table reads (N=10,050: 50 of them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pyarrow.fs as pafs  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from lake_seed import seed_enqueues  # noqa: E402

from poison_pipeline.defs.sensors import decide  # noqa: E402
from poison_pipeline.domain.declaration import AgeLevels, Declaration, parse_declaration  # noqa: E402
from poison_pipeline.operations.checks import (  # noqa: E402
    POISON_GROWTH,
    check_conservation,
    check_growth,
    check_oldest_waiting,
    check_one_place,
)
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402
from poison_pipeline.storage.tables import QueueTables  # noqa: E402
from poison_pipeline.storage.uri import fs_of  # noqa: E402
from poison_pipeline_tests import s3_support  # noqa: E402

TARGETS = {"idle_sensor_requests": 10, "cycle_100_requests": 100, "cycle_100_seconds_delayed": 3.0}
HANDLER = "poison_pipeline_tests.handlers:accept"


class RequestLog:
    """The server's request log: counts the requests made since the last `reset`, by method."""

    _LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|PUT|POST|DELETE|HEAD) ')

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen = 0

    def _methods(self) -> list[str]:
        time.sleep(0.2)  # the server writes its log line after the answer
        with open(self.path, errors="replace") as log:
            return [m.group(1) for line in log if (m := self._LINE.search(line))]

    def reset(self) -> None:
        self.seen = len(self._methods())

    def since(self) -> Counter[str]:
        return Counter(self._methods()[self.seen:])


def _declaration(root: str, options: dict[str, str]) -> Declaration:
    return parse_declaration({
        "lake_root": root, "storage_options": options, "small_cycles": {"max_messages": 1000},
        "lease": {"wait": "60s", "expiry": "30s"},
        "queues": {q: {"handler": HANDLER, "policy": {"receive_retry_count": 0, "max_retry_cycles": 1,
                                                     "retry_cycle_delay": "1h"}}
                   for q in ("q", "fresh")}})


def _no_spark() -> Any:
    raise AssertionError("a 100-message cycle takes the small path: no Spark")


def _requests(log: RequestLog, action: Any) -> tuple[int, dict[str, int], float]:
    log.reset()
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    counts = log.since()
    return sum(counts.values()), dict(counts), seconds


def _seed(declaration: Declaration, commits: int, workdir: str, options: dict[str, str]) -> None:
    """What `commits` one-message enqueues leave in queue q, written locally and uploaded."""
    local = parse_declaration({**json.loads(declaration.model_dump_json()), "lake_root": f"{workdir}/seed",
                               "storage_options": {}})
    seed_enqueues(local, "q", [[json.dumps({"message_id": f"s{i}", "message_type": "t", "body": {}})]
                               for i in range(commits)], f"{workdir}/scratch")
    fs, path = fs_of(declaration.lake_root, options)
    pafs.copy_files(f"{workdir}/seed", path, destination_filesystem=fs, use_threads=True)


def _checks(tables: QueueTables) -> dict[str, Callable[[], Any]]:
    return {
        "conservation": lambda: check_conservation(tables),
        "one_place": lambda: check_one_place(tables),
        "poison_growth": lambda: check_growth(tables, POISON_GROWTH, 1_000, None),
        "oldest_waiting_inbound": lambda: check_oldest_waiting(tables, "inbound", AgeLevels(warn=timedelta(hours=1))),
    }


def _hundred(prefix: str) -> list[dict[str, Any]]:
    return [{"message_id": f"{prefix}{i}", "message_type": "t", "body": {}} for i in range(100)]


def _timed_cycles(delay_ms: float, cycles: int) -> float:
    """The median time of `cycles` 100-message cycles of a fresh queue, on a server adding `delay_ms`."""
    server = s3_support.serve(delay_ms=delay_ms)
    options = next(server)
    try:
        declaration = _declaration(s3_support.fresh_root("timed"), options)
        times = []
        for k in range(cycles + 1):
            enqueue(declaration, "fresh", _hundred(f"t{k}-"))
            started = time.perf_counter()
            run_cycle(_no_spark, declaration, "fresh", "inbound")
            times.append(time.perf_counter() - started)
    finally:
        for _ in server:
            pass
    return round(statistics.median(times[1:]), 2)


def run(commits: int, prior: int, workdir: str, delay_ms: float, timed: int) -> dict[str, Any]:
    load_start = os.getloadavg()
    os.environ["XDG_CACHE_HOME"] = f"{workdir}/cache"  # the checks' cache: cold at first
    server = s3_support.serve(log=os.path.join(workdir, "requests.log"))
    options = next(server)
    try:
        log = RequestLog(os.path.join(workdir, "requests.log"))
        declaration = _declaration(s3_support.fresh_root("cost"), options)
        _seed(declaration, commits, workdir, options)
        tables = QueueTables.of(declaration, "q")
        now = datetime.now(UTC)
        first = decide(tables, "inbound", {}, now)  # the evaluation that requested a run
        assert first.run_key is not None, first.skip
        full, _, _ = _requests(log, lambda: decide(tables, "inbound", {}, now))
        idle, idle_by, _ = _requests(log, lambda: decide(tables, "inbound", first.cursor, now))
        checks = {name: [_requests(log, check)[0] for _ in range(2)] for name, check in _checks(tables).items()}
        enqueue(declaration, "fresh", _hundred("m"))
        cycle, cycle_by, cycle_s = _requests(log, lambda: run_cycle(_no_spark, declaration, "fresh", "inbound"))
        for k in range(prior):
            enqueue(declaration, "fresh", _hundred(f"p{k}-"))
            run_cycle(_no_spark, declaration, "fresh", "inbound")
        enqueue(declaration, "fresh", _hundred("n"))
        later, later_by, _ = _requests(log, lambda: run_cycle(_no_spark, declaration, "fresh", "inbound"))
    finally:
        for _ in server:
            pass
    delayed, undelayed = _timed_cycles(delay_ms, timed), _timed_cycles(0, timed)
    figures = {"idle_sensor_requests": idle, "cycle_100_requests": max(cycle, later),
               "cycle_100_seconds_delayed": delayed}
    return {
        "benchmark": "object_store_cost",
        "inbound_commits": commits,
        "idle_sensor_requests": idle,
        "idle_sensor_by_method": idle_by,
        "sensor_without_cursor_requests": full,
        "check_requests_first_then_next": checks,
        "cycle_100_requests": cycle,
        "cycle_100_by_method": cycle_by,
        "cycle_100_seconds": round(cycle_s, 2),
        "prior_cycles": prior,
        "cycle_100_after_prior_requests": later,
        "cycle_100_after_prior_by_method": later_by,
        "delay_ms": delay_ms,
        "timed_cycles": timed,
        "cycle_100_seconds_delayed": delayed,
        "cycle_100_seconds_undelayed": undelayed,
        "targets": TARGETS,
        "within_target": {k: figures[k] <= TARGETS[k] for k in TARGETS},
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=10_050, help="one-message enqueues seeding queue q")
    parser.add_argument("--prior-cycles", type=int, default=45,
                        help="100-message cycles of the fresh queue before its cycle is counted again")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added to every request of the timed cycles")
    parser.add_argument("--timed-cycles", type=int, default=5, help="timed 100-message cycles at each delay")
    parser.add_argument("--quick", action="store_true",
                        help="50 commits, 2 prior cycles, 1 timed cycle (CI: checks that it runs)")
    args = parser.parse_args(argv)
    commits, prior, timed = (50, 2, 1) if args.quick else (args.commits, args.prior_cycles, args.timed_cycles)
    if commits < 1:
        parser.error("--commits must be at least 1")
    if prior < 0:
        parser.error("--prior-cycles must be 0 or more")
    if timed < 1:
        parser.error("--timed-cycles must be at least 1")
    if args.delay_ms < 0:
        parser.error("--delay-ms must be 0 or more")
    return emit(lambda workdir: run(commits, prior, workdir, args.delay_ms, timed), None, "object_store_cost-")


if __name__ == "__main__":
    sys.exit(main())
