"""Latency: how long from enqueue until the handler ran, under the real `dagster dev`.

    .venv/bin/python benchmarks/latency.py [--quick] [--look-every 5s] [--stay 1m]
        [--slow-rate 10] [--slow-seconds 180] [--fast-rate 1000] [--fast-seconds 180]

As `make ui` runs it: `dagster dev` (webserver and daemon, the repo's dagster.yaml: warm run
launcher, run queue dequeued every second) with a Spark Connect server beside it, on a temporary
DAGSTER_HOME and lake. One queue (the example inventory handler, recording when it handled each
message: latency_handler.py) declared with `latency: {look_every, stay}` and small
cycles of up to 20,000 messages (`small_cycles.max_messages`); nothing but
the daemon's sensors launches its runs. A feeder enqueues through the Python API at a steady
`--slow-rate` msg/s (one enqueue call per message), then at `--fast-rate` msg/s (a call every
0.1 s with what arrived since the last), 1% of them poison (an obsolete part: quarantined at once).

Reported per phase: enqueue-to-handled p50, p99 and max (the feeder's clock before its enqueue
call, the handler's after it returned), the poison messages' enqueue-to-quarantine apart, the
rate achieved, and the inbound's backlog sampled every 2 s (its last third against its first:
a backlog that grows says the queue cannot keep up). Where the seconds go: runs and cycles, a
run's wait from creation to start, cycle durations, and the gap between one run's end and the
next one's start. One JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import latency_handler  # noqa: E402
import soak_dagster as dg  # noqa: E402

QUEUE = "inventory"
POISON_EVERY = 100  # 1% poison


def declaration_file(folder: Path, look_every: str, stay: str) -> Path:
    path = folder / "latency.yaml"
    path.write_text(yaml.safe_dump({
        "lake_root": str(folder / "lake"),
        "spark": {"master": "local[2]", "config": {"spark.sql.shuffle.partitions": "2",
                                                   "spark.ui.enabled": "false"}},
        # A cycle of a few thousand messages is done sooner in one worker than by a Spark job, whose
        # fixed cost would make a cycle that fell behind fall further behind.
        "small_cycles": {"max_messages": 20000},
        "queues": {QUEUE: {
            "handler": latency_handler.HANDLER,
            "policy": {"receive_retry_count": 1, "max_retry_cycles": 0, "receive_error_handling": "move",
                       "unrecoverable": {"exceptions": ["poison_pipeline.examples.handlers:PartObsolete"],
                                         "route": "quarantine"}},
            "latency": {"look_every": look_every, "stay": stay},
        }},
    }))
    return path


def body(n: int) -> dict[str, Any]:
    part = f"OBS-{n}" if n % POISON_EVERY == POISON_EVERY - 1 else f"P-{n % 977}"
    return {"part": part, "quantity": 1 + n % 5, "order": n}


class Feeder:
    """Enqueues `rate` msg/s for `seconds` through the Python API; when each was handed over."""

    def __init__(self, declaration: Any, phase: str, rate: float, seconds: float) -> None:
        self.declaration, self.phase, self.rate, self.seconds = declaration, phase, rate, seconds
        self.sent: dict[str, float] = {}
        self.poison: set[str] = set()

    def run(self) -> None:
        from poison_pipeline.operations.records import enqueue

        # One call per message at a slow rate, as an application sends them; at a fast one, a call
        # every 0.1 s with what arrived since the last (no store takes 1,000 commits a second).
        tick = 1.0 / self.rate if self.rate <= 20 else 0.1
        start = time.time()
        n = 0
        while (now := time.time()) < start + self.seconds:
            due = int((now - start) * self.rate) + 1
            records: list[dict[str, Any]] = [
                {"message_id": f"{self.phase}-{i}", "message_type": "inventory.withdraw", "body": body(i)}
                for i in range(n, due)]
            if records:
                at = time.time()
                result = enqueue(self.declaration, QUEUE, records)
                assert not result.refused, result.refused
                for i, record in zip(range(n, due), records, strict=True):
                    self.sent[record["message_id"]] = at
                    if i % POISON_EVERY == POISON_EVERY - 1:
                        self.poison.add(record["message_id"])
                n = due
            time.sleep(max(0.0, start + n / self.rate - time.time(), tick / 10))
        self.elapsed = time.time() - start


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.50), 3), "p99": round(pick(0.99), 3), "max": round(ordered[-1], 3)}


def backlog_sampler(declaration: Any, samples: list[tuple[float, int]], stop: threading.Event) -> None:
    from poison_pipeline.storage.tables import QueueTables

    tables = QueueTables.of(declaration, QUEUE)
    while not stop.wait(2.0):
        try:
            samples.append((time.time(), tables.stats("inbound", datetime.now(UTC)).rows))
        except FileNotFoundError:
            samples.append((time.time(), 0))


def phase_result(feeder: Feeder, handled: dict[str, float], quarantined: dict[str, float],
                 backlog: list[tuple[float, int]]) -> dict[str, Any]:
    waits = [handled[m] - at for m, at in feeder.sent.items() if m not in feeder.poison and m in handled]
    poison = [quarantined[m] - at for m, at in feeder.sent.items() if m in feeder.poison and m in quarantined]
    third = max(1, len(backlog) // 3)
    first, last = [b for _, b in backlog[:third]], [b for _, b in backlog[-third:]]
    return {
        "rate_asked": feeder.rate, "rate_achieved": round(len(feeder.sent) / feeder.elapsed, 1),
        "messages": len(feeder.sent), "handled": len(waits), "poison": len(feeder.poison),
        "quarantined": len(poison),
        "enqueue_to_handled_s": percentiles(waits), "enqueue_to_quarantine_s": percentiles(poison),
        "backlog_first_third_mean": round(statistics.fmean(first), 1) if first else None,
        "backlog_last_third_mean": round(statistics.fmean(last), 1) if last else None,
        "backlog_max": max((b for _, b in backlog), default=None),
    }


def where_the_time_goes(instance: Any, since: float, until: float) -> dict[str, Any]:
    """The queue's inbound runs that overlapped the phase: how long each waited to start, the
    cycles of the phase (their durations), the gaps between one run's end and the next's start."""
    from dagster import RunsFilter

    records = sorted(instance.get_run_records(RunsFilter(job_name=f"{QUEUE}__inbound_cycle")),
                     key=lambda r: r.create_timestamp)
    records = [r for r in records if r.create_timestamp.timestamp() <= until and (r.end_time or until) >= since]
    waits = [r.start_time - r.create_timestamp.timestamp() for r in records if r.start_time]
    spans = [(r.start_time, r.end_time) for r in records if r.start_time and r.end_time]
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False) if b[0] >= a[1]]
    cycles = [c for r in records for c in dg.cycle_materializations(instance, r.dagster_run.run_id)
              if c["table"] == "inbound" and since <= c["at"] <= until]
    taken = [int(c["messages"]) for c in cycles if int(c["messages"]) > 0]
    return {
        "runs": len(records), "cycles": len(cycles), "cycles_with_messages": len(taken),
        "messages_per_cycle": percentiles([float(n) for n in taken]),
        "run_create_to_start_s": percentiles(waits),
        "cycle_duration_s": percentiles([float(c["duration_s"]) for c in cycles]),
        "gap_between_runs_s": percentiles(gaps),
    }


def measure(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from dagster import DagsterInstance

    from poison_pipeline.defs.resources import REMOTE_ENV
    from poison_pipeline.domain.declaration import load_declaration
    from poison_pipeline.engine.local_servers import start_connect_server
    from poison_pipeline.storage.tables import QueueTables

    config = declaration_file(folder, args.look_every, args.stay)
    declaration = load_declaration(config)
    app_db = folder / "app_db"
    app_db.mkdir()
    os.environ["POISON_PIPELINE_APP_DB"] = str(app_db)
    log = folder / "handled.log"
    os.environ[latency_handler.LOG_ENV] = str(log)
    home = dg.dagster_home(folder)
    server = start_connect_server(declaration.spark, folder / "spark_connect", pythonpath=[str(REPO), str(HERE)])
    dev = None
    try:
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
        dev = dg.DagsterDev(home, config, app_db, folder / "dagster_dev.log",
                            env={REMOTE_ENV: server.session_url(), "PYTHONPATH": path})
        dev.wait_ready(240)
        # The first run starts the warm run launcher's process and a Spark Connect session: a
        # message a user sends a minute after `make ui` does not wait for those, so neither does this.
        deliveries = Deliveries(log)
        warm = Feeder(declaration, "warm", 1.0, 1.0)
        warm.run()
        _wait_for(lambda: deliveries.count("warm") >= len(warm.sent) - len(warm.poison), 180)
        results: dict[str, Any] = {}
        with DagsterInstance.from_config(str(home)) as instance:
            for phase, rate, seconds in (("slow", args.slow_rate, args.slow_seconds),
                                         ("fast", args.fast_rate, args.fast_seconds)):
                since = time.time()
                feeder = Feeder(declaration, phase, rate, seconds)
                backlog: list[tuple[float, int]] = []
                stop = threading.Event()
                sampler = threading.Thread(target=backlog_sampler, args=(declaration, backlog, stop))
                sampler.start()
                feeder.run()
                stop.set()
                sampler.join()
                expected = len(feeder.sent) - len(feeder.poison)

                _wait_for(lambda p=phase, n=expected: deliveries.count(p) >= n, args.drain_seconds)
                quarantined = _quarantined(QueueTables.of(declaration, QUEUE), phase)
                results[phase] = phase_result(feeder, deliveries.first, quarantined, backlog)
                results[phase]["runs"] = where_the_time_goes(instance, since, time.time())
        return results
    finally:
        if dev is not None:
            dev.stop()
        server.stop()


class Deliveries:
    """The handler's record of deliveries, read as it grows: when each message was first handled
    (a later delivery of one is a redelivery after a run that failed)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.first: dict[str, float] = {}
        self.per_phase: dict[str, int] = {}

    def count(self, phase: str) -> int:
        if self.path.exists():
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
            complete = data[:data.rfind(b"\n") + 1]
            self.offset += len(complete)
            for line in complete.decode().splitlines():
                message_id, at = line.split(" ")
                if message_id not in self.first:
                    self.first[message_id] = float(at)
                    name = message_id.rsplit("-", 1)[0]
                    self.per_phase[name] = self.per_phase.get(name, 0) + 1
        return self.per_phase.get(phase, 0)


def _quarantined(tables: Any, phase: str) -> dict[str, float]:
    try:
        rows = tables.open("quarantine").to_pyarrow_table(columns=["message_id", "quarantined_at"]).to_pylist()
    except FileNotFoundError:
        return {}
    return {r["message_id"]: r["quarantined_at"].timestamp() for r in rows if r["message_id"].startswith(f"{phase}-")}


def _wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short phases (CI): 8 s at 10 msg/s, 8 s at 200")
    parser.add_argument("--look-every", default="5s")
    parser.add_argument("--stay", default="1m")
    parser.add_argument("--slow-rate", type=float, default=10.0)
    parser.add_argument("--slow-seconds", type=float, default=180.0)
    parser.add_argument("--fast-rate", type=float, default=1000.0)
    parser.add_argument("--fast-seconds", type=float, default=180.0)
    parser.add_argument("--drain-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.slow_seconds, args.fast_rate, args.fast_seconds = 8.0, 200.0, 8.0
    with tempfile.TemporaryDirectory(prefix="latency-") as folder:
        phases = measure(Path(folder), args)
    slow, fast = phases["slow"], phases["fast"]
    slow_p99, fast_p99 = slow["enqueue_to_handled_s"]["p99"], fast["enqueue_to_handled_s"]["p99"]
    growing = backlog_growing(fast)
    line = {
        "benchmark": "latency", "look_every": args.look_every, "stay": args.stay, **phases,
        "targets": {"slow_p99_s": 5.0, "fast_p99_s": 15.0},
        "backlog_growing": growing,
        "within_target": bool(slow_p99 is not None and slow_p99 <= 5.0 and fast_p99 is not None
                              and fast_p99 <= 15.0 and not growing),
    }
    print(json.dumps(line))
    return 0


def backlog_growing(phase: dict[str, Any]) -> bool:
    """Whether the inbound's backlog in the phase's last third is over twice that of its first; a
    backlog of a second's arrivals is no backlog: it is what waits between two cycles."""
    floor = float(phase["rate_asked"])
    return (phase["backlog_last_third_mean"] or 0) > 2 * max(phase["backlog_first_third_mean"] or 0, floor)


if __name__ == "__main__":
    sys.exit(main())
