"""Soak: the example queues for N minutes under real Dagster, with traffic, an outage, kills and
concurrent starts; then the queues drain and the books must balance.

    make soak [SOAK_MINUTES=30]
    .venv/bin/python benchmarks/soak.py [--minutes M | --seconds S] [--queues a,b] [--workdir DIR]

`dagster dev` (webserver and daemon) runs on a temporary DAGSTER_HOME with the repo's dagster.yaml,
on the demo's declaration (poison_pipeline.yaml) with its retry delays cut to seconds, its lease
expiry to 20 s (a killed run's queue resumes within the soak's tempo) and its handlers recording
each delivery in the application database (poison_pipeline/examples/delivery_log.py). Nothing but
the daemon's sensors launches the cycles, while:

- a producer enqueues a batch of the demo's messages to every fed queue every 3 s (poison,
  transient failures, conversations, shipments sent from checkout to shipping);
- an outage: the inventory database goes down at a third of the time (examples/handlers.py's
  flag file) until the outage detection has disabled the queue, stays down a while, comes back,
  and `poison-pipeline enable inventory` resumes the queue; one outage per 10 minutes;
- kills: at random moments a running cycle run's process tree is killed with SIGKILL, every other
  one while the run is inside its cycle (holding the queue's lease), about one kill a minute;
- concurrent starts: while a cycle run of a queue is inside its cycle, the same asset is materialized
  from outside its job (an asset page's launch: no queue tag, so only the lease keeps the two
  apart) and a script runs the same cycle with `run_cycle` beside Dagster; each must finish or
  fail cleanly as busy (about one try a minute).

Then the producer stops; the sensors get `--drain-seconds` to empty the queues, the sensors are
stopped, runs still queued are canceled, those started finish, `dagster dev` stops, and whatever
still waits is drained by cycles run directly. Checked: every queue's conservation and one_place
checks, the intake against what was enqueued, each message delivered once (a run that failed or was
killed committed nothing, so its deliveries are delivered again: allowed), every processed message
delivered, no run failed for a reason of its own, and the cycle time (seconds per message, first
third against last: soak_verify.growth). Prints one JSON line and appends it to
benchmarks/results/soak.jsonl; exits 1 if a correctness check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import soak_dagster as dg  # noqa: E402
import soak_verify  # noqa: E402
import soak_worker  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from dagster import DagsterInstance, DagsterRunStatus  # noqa: E402
from soak_load import Producer  # noqa: E402

from poison_pipeline.demo import shortened  # noqa: E402
from poison_pipeline.domain.declaration import Declaration, LeaseSettings, load_declaration  # noqa: E402
from poison_pipeline.examples.delivery_log import read_deliveries  # noqa: E402
from poison_pipeline.storage.control import queue_state  # noqa: E402
from poison_pipeline.storage.tables import QueueTables  # noqa: E402

REPO = HERE.parent
RESULTS = HERE / "results" / "soak.jsonl"
QUEUES = ("inventory", "orders", "accounts", "presentations", "checkout", "shipping")
OUTAGE_QUEUE = "inventory"
RETRY_DELAY = timedelta(seconds=5)
LEASE_EXPIRY = timedelta(seconds=20)
PRODUCER_INTERVAL_S = 3.0


def soak_declaration(folder: Path, queues: list[str]) -> Path:
    """The demo's declaration for the soak (see the module's docstring), written to a file."""
    base = shortened(load_declaration(REPO / "poison_pipeline.yaml"), folder / "lake", RETRY_DELAY)
    kept = {name: queue.model_copy(update={"handler": queue.handler.replace(
                "poison_pipeline.examples.handlers:", "poison_pipeline.examples.delivery_log:")})
            for name, queue in base.queues.items() if name in queues}
    declaration = base.model_copy(update={"queues": kept, "lease": LeaseSettings(expiry=LEASE_EXPIRY)})
    path = folder / "poison_pipeline.yaml"
    path.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    load_declaration(path)  # what dagster dev will load: fail here, naming the field, if it is invalid
    return path


@dataclass
class Tally:
    kills: list[dict[str, Any]] = field(default_factory=list)
    concurrent: list[dict[str, Any]] = field(default_factory=list)
    outside: list[tuple[subprocess.Popen[str], dict[str, Any]]] = field(default_factory=list)
    outages: list[dict[str, Any]] = field(default_factory=list)
    doomed: set[str] = field(default_factory=set)


class Soak:
    def __init__(self, folder: Path, seconds: float, queues: list[str], seed: int, drain_s: float) -> None:
        self.folder = folder
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.seed = seed
        self.drain_s = drain_s
        self.app_db = folder / "app_db"
        self.app_db.mkdir(parents=True)
        os.environ["POISON_PIPELINE_APP_DB"] = str(self.app_db)  # this process's handlers: the drain's
        self.config = soak_declaration(folder, queues)
        self.declaration: Declaration = load_declaration(self.config)
        self.home = dg.dagster_home(folder)
        self.tally = Tally()
        self.choosing = threading.Lock()
        self.pids: dict[str, int] = {}
        self.producer_conflicts = 0
        self.log = folder / "soak.log"

    def say(self, text: str) -> None:
        line = f"[soak {datetime.now(UTC).strftime('%H:%M:%S')}] {text}"
        print(line, file=sys.stderr, flush=True)
        with self.log.open("a") as out:
            out.write(line + "\n")

    # --- the events -------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds from start, what): kills and concurrent starts at random moments, about one of
        each a minute and at least one; an outage at a third of each 10 minutes (at least one)."""
        span = self.seconds
        n = max(1, round(span / 60))
        # A short soak has a few runs only: its kill and concurrent start go early, to find one.
        latest = 0.95 if span >= 180 else 0.5
        events = [(self.rng.uniform(0.15, latest) * span, "kill") for _ in range(n)]
        events += [(self.rng.uniform(0.1, latest) * span, "concurrent") for _ in range(n)]
        if OUTAGE_QUEUE in self.declaration.queues:
            outages = max(1, round(span / 600))
            events += [((k + (1 / 3 if span >= 180 else 0.1)) * span / outages, "outage") for k in range(outages)]
        return sorted(events)

    def cycle_runs(self, instance: DagsterInstance) -> list[dg.RunInfo]:
        """The cycle runs going now (a run killed a moment ago may still show as started)."""
        return [r for r in dg.runs(instance, (DagsterRunStatus.STARTED,))
                if r.queue is not None and r.run_id not in self.tally.doomed]

    def holding(self, run: dg.RunInfo) -> bool:
        """Whether `run` holds its queue's lease now: it is inside its cycle."""
        holder = QueueTables.of(self.declaration, str(run.queue)).lease_holder()
        return holder is not None and holder.run_id == run.run_id

    def pick(self, instance: DagsterInstance, deadline: float, in_cycle: bool, doom: bool) -> dg.RunInfo | None:
        """A cycle run going now: one inside its cycle (holding the lease) when `in_cycle`, else any,
        a random moment (up to 3 s) after it was found started; marked doomed when `doom` (to be
        killed), in one step with the choice so that no other event picks it as going on."""
        while time.monotonic() < deadline:
            started = self.cycle_runs(instance)
            if in_cycle:
                # Each run's pid first (read from its event log): a small cycle holds the lease for
                # well under a second, and was often over by the time that lookup came after it.
                for run in started:
                    self.pid_of(instance, run.run_id)
                started = [r for r in started if self.holding(r)]
            elif started:
                time.sleep(self.rng.uniform(0.0, 3.0))
            with self.choosing:
                started = [r for r in started if r.run_id not in self.tally.doomed]
                if started:
                    run = self.rng.choice(started)
                    if doom:
                        self.tally.doomed.add(run.run_id)
                    return run
            time.sleep(0.1 if in_cycle else 0.25)
        return None

    def pid_of(self, instance: DagsterInstance, run_id: str) -> int | None:
        """A run worker's pid, once it is logged."""
        if run_id not in self.pids and (pid := dg.run_pid(instance, run_id)) is not None:
            self.pids[run_id] = pid
        return self.pids.get(run_id)

    def kill(self, instance: DagsterInstance, deadline: float) -> None:
        """kill -9 a cycle run's process tree: every other kill inside the cycle (lease held), the
        others at a random moment of the run (starting, in its cycle, in its checks, ending)."""
        in_cycle = len(self.tally.kills) % 2 == 0
        while (run := self.pick(instance, deadline, in_cycle, doom=True)) is not None:
            pid = self.pid_of(instance, run.run_id)
            frozen = dg.freeze(pid) if pid is not None else {}
            # Frozen, the run can neither release its lease nor renew it: this says where it stopped.
            holding = bool(frozen) and self.holding(run)
            if in_cycle and not holding:
                dg.thaw(frozen)  # its cycle ended between the look and the freeze: find another
                self.tally.doomed.discard(run.run_id)
                continue
            if frozen:
                dg.kill_frozen(frozen)
                self.tally.kills.append({"run_id": run.run_id, "queue": run.queue, "table": run.table,
                                         "processes": len(frozen), "holding_lease": holding})
                self.say(f"killed run {run.run_id[:8]} ({run.job}) and {len(frozen) - 1} process(es) under it"
                         f"{' while it held the lease' if holding else ''}")
                return
        self.say("no cycle run to kill this time")

    def concurrent(self, server: dg.DagsterDev, instance: DagsterInstance, deadline: float) -> None:
        """While a cycle run of a queue is inside its cycle: the same asset from an asset page, and the
        same cycle from a script beside Dagster."""
        run = self.pick(instance, deadline, in_cycle=True, doom=False)
        if run is None:
            self.say("no cycle run to start beside this time")
            return
        assert run.queue is not None and run.table is not None
        outside = subprocess.Popen(
            [sys.executable, str(HERE / "soak_worker.py"), "cycle", str(self.config), run.queue, run.table],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        second = server.materialize(run.queue, run.table)
        self.tally.concurrent.append({"while": run.run_id, "queue": run.queue, "table": run.table,
                                      "asset_run": second})
        self.tally.outside.append((outside, {"queue": run.queue, "table": run.table, "pid": outside.pid,
                                             "started": time.time()}))
        self.say(f"concurrent starts of {run.queue}/{run.table} while run {run.run_id[:8]} is in its cycle: "
                 f"asset run {second[:8]} and a script (pid {outside.pid})")

    def outage(self, deadline: float, hold_s: float) -> None:
        """The inventory database down until the queue is disabled (or `deadline`), `hold_s` more,
        then back, and the queue enabled from the command line."""
        flag = self.app_db / "inventory.down"
        flag.touch()
        down_at = time.monotonic()
        record: dict[str, Any] = {"queue": OUTAGE_QUEUE, "detected_after_s": None, "enabled": False}
        self.tally.outages.append(record)
        self.say("the inventory database is down")
        tables = QueueTables.of(self.declaration, OUTAGE_QUEUE)
        while time.monotonic() < deadline:
            if tables.exists("events") and not queue_state(tables).enabled:
                record["detected_after_s"] = round(time.monotonic() - down_at, 1)
                self.say(f"inventory disabled after {record['detected_after_s']}s: {queue_state(tables).reason}")
                time.sleep(hold_s)
                break
            time.sleep(1.0)
        flag.unlink()
        self.say("the inventory database is back")
        if not queue_state(tables).enabled:
            done = subprocess.run([str(Path(sys.executable).parent / "poison-pipeline"), "enable", OUTAGE_QUEUE,
                                   "--config", str(self.config), "--reason", "the inventory database is back",
                                   "--actor", "soak"], capture_output=True, text=True, check=False)
            record["enabled"] = done.returncode == 0 and queue_state(tables).enabled
            self.say(f"enable: exit {done.returncode}: {done.stdout.strip() or done.stderr.strip()[-300:]}")
        record["down_s"] = round(time.monotonic() - down_at, 1)

    # --- the run ----------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        load_start = os.getloadavg()
        wall = time.monotonic()
        server = dg.DagsterDev(self.home, self.config, self.app_db, self.folder / "dagster_dev.log")
        producer = Producer(self.declaration, PRODUCER_INTERVAL_S, self.seed)
        try:
            server.wait_ready(300)
            self.say(f"dagster dev is up ({time.monotonic() - wall:.0f}s); soaking {self.seconds:.0f}s, "
                     f"queues {', '.join(self.declaration.queues)}")
            with DagsterInstance.from_config(str(self.home)) as instance, ThreadPoolExecutor(8) as chaos:
                start_epoch = time.time()
                start = time.monotonic()
                end = start + self.seconds
                producer.start()
                # Events may go on after the producer stopped: runs go on while the queues drain.
                actions: dict[str, Callable[[], None]] = {
                    "kill": lambda: self.kill(instance, end + 30),
                    "concurrent": lambda: self.concurrent(server, instance, end + 30),
                    "outage": lambda: self.outage(end + 60, hold_s=min(60.0, self.seconds / 10)),
                }
                # Each event in a thread of its own: an outage held for a minute delays no kill.
                events = [chaos.submit(self._at, start + at, actions[what]) for at, what in self.schedule()]
                time.sleep(max(0.0, end - time.monotonic()))
                producer.join_checked()
                self.producer_conflicts = producer.conflicts
                stop_epoch = time.time()
                self.say(f"producer stopped: {dict(producer.enqueued)}")
                for event in events:
                    event.result()
                drained_by_sensors = self.wait_quiet(instance, self.drain_s)
                self.say(f"the sensors {'emptied' if drained_by_sensors else 'did not empty'} the queues")
                self.stop_sensors(server)
                self.finish_runs(server, instance, 240)
                self.say("the runs finished")
                server.stop()
                self.say("dagster dev stopped")
                outside = self.collect_outside()
                drain = self.drain_directly()
                self.say(f"drained directly: {drain}")
                report = self.verify(instance, producer.enqueued, start_epoch, stop_epoch, outside)
                report.update(drained_by_sensors=drained_by_sensors, direct_drain=drain)
        finally:
            producer.stopped.set()
            server.stop()
            for process, _ in self.tally.outside:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        report.update(wall_seconds=round(time.monotonic() - wall, 1),
                      load_avg={"start": load_start, "end": os.getloadavg()})
        return report

    @staticmethod
    def _at(when: float, action: Callable[[], None]) -> None:
        time.sleep(max(0.0, when - time.monotonic()))
        action()

    def wait_quiet(self, instance: DagsterInstance, seconds: float) -> bool:
        """Until nothing waits in any queue and no run is unfinished, or `seconds` pass."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not soak_worker.waiting(self.declaration, datetime.now(UTC)) and not dg.runs(instance, dg.UNFINISHED):
                return True
            time.sleep(3.0)
        return False

    def stop_sensors(self, server: dg.DagsterDev) -> None:
        query = """query($repo: RepositorySelector!) { sensorsOrError(repositorySelector: $repo) {
            ... on Sensors { results { id name } } } }"""
        sensors = server.graphql(query, {"repo": {"repositoryName": dg.REPOSITORY,
                                                  "repositoryLocationName": dg.LOCATION}})
        for sensor in sensors["sensorsOrError"]["results"]:
            server.graphql("""mutation($id: String!) { stopSensor(id: $id) { __typename } }""", {"id": sensor["id"]})

    def finish_runs(self, server: dg.DagsterDev, instance: DagsterInstance, seconds: float) -> None:
        """Cancel the runs still queued (the direct drain does their work), let those started finish,
        and kill -9 any still going after `seconds` (not counted as the soak's kills: their
        deliveries are allowed again like those of any run that failed)."""
        for run in dg.runs(instance, (DagsterRunStatus.QUEUED,)):
            server.graphql("""mutation($id: String!) { terminateRun(runId: $id) { __typename } }""",
                           {"id": run.run_id})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and dg.runs(instance, dg.UNFINISHED):
            time.sleep(2.0)
        for run in dg.runs(instance, (DagsterRunStatus.STARTED,)):
            pid = dg.run_pid(instance, run.run_id)
            if pid is not None and dg.kill_tree(pid):
                self.say(f"run {run.run_id[:8]} ({run.job}) still going at the end: killed")

    def collect_outside(self) -> list[dict[str, Any]]:
        found = []
        for process, what in self.tally.outside:
            out, err = process.communicate(timeout=600)
            what = {**what, "ended": time.time()}
            lines = [line for line in out.splitlines() if line.startswith("{")]
            result = json.loads(lines[-1]) if lines else {"outcome": "error"}
            clean = process.returncode in (0, soak_worker.BUSY) and result["outcome"] in ("ran", "busy")
            found.append({**what, **result, "exit": process.returncode, "clean": clean,
                          **({} if clean else {"stderr": err[-2000:]})})
        return found

    def drain_directly(self) -> dict[str, Any]:
        done = subprocess.run([sys.executable, str(HERE / "soak_worker.py"), "drain", str(self.config), "600"],
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "PYSPARK_PYTHON": sys.executable})
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"the direct drain failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return dict(json.loads(lines[-1]))

    def verify(self, instance: DagsterInstance, enqueued: Counter[str], start: float, stop: float,
               outside: list[dict[str, Any]]) -> dict[str, Any]:
        runs = dg.runs(instance)
        spans, cycles = [], []
        for run in runs:
            materialized = dg.cycle_materializations(instance, run.run_id) if run.queue else []
            cycles += [c for c in materialized if not c.get("skipped")]
            pid = dg.run_pid(instance, run.run_id)
            if pid is not None and run.start is not None:
                spans.append(soak_verify.RunSpan(run.run_id, pid, run.start, run.end or time.time(),
                                                 run.status == "SUCCESS" or bool(materialized)))
        # A script beside Dagster that failed (it lost its lease, say) committed nothing of its
        # cycle: its deliveries are made again, as a failed run's are.
        spans += [soak_verify.RunSpan(f"script-{o['pid']}", o["pid"], o["started"], o["ended"],
                                      o["clean"] and o["outcome"] == "ran") for o in outside]
        statuses = Counter(f"{'cycle' if r.queue else 'other'}:{r.status}" for r in runs)
        asset_runs = {c["asset_run"]: c for c in self.tally.concurrent}
        dagster_tries = []
        for run in runs:
            if run.run_id in asset_runs:
                text = dg.run_log_text(instance, run.run_id)
                waited = "waiting for the queue's lease" in text
                busy = "is busy" in text
                killed = any(k["run_id"] == run.run_id for k in self.tally.kills)
                # Still queued when the soak ended, and canceled by it: it never started.
                clean = run.status in ("SUCCESS", "CANCELED") or busy or killed
                dagster_tries.append({"run_id": run.run_id, "status": run.status, "waited": waited,
                                      "busy": busy, "clean": clean})
        unclean_failures, conflicts = self.unexplained_failures(instance, runs)
        books = soak_verify.balances(self.declaration, dict(enqueued))
        delivered = soak_verify.deliveries(self.declaration, read_deliveries(self.app_db), spans)
        times = soak_verify.growth(cycles, start, stop)
        left = soak_worker.waiting(self.declaration, datetime.now(UTC))
        ok = (all(b["conservation"] and b["one_place"] and b["intake_matches"] for b in books.values())
              and delivered["duplicates_outside_allowance"] == 0 and not delivered["delivered_not_processed"]
              and not delivered["processed_not_delivered"] and not left and not unclean_failures
              and not conflicts
              and all(t["clean"] for t in dagster_tries + outside)
              and all(o["enabled"] for o in self.tally.outages))
        growth = times["growth"]
        return {
            "benchmark": "soak",
            "minutes": round(self.seconds / 60, 2),
            "queues": list(self.declaration.queues),
            "messages_enqueued": sum(enqueued.values()),
            "enqueued_by_queue": dict(enqueued),
            "accepted_by_queue": {q: b["accepted"] for q, b in books.items()},
            "cycles_run": len([c for c in cycles if c["messages"] > 0]),
            "runs": dict(statuses),
            "kills": len(self.tally.kills),
            "kills_holding_lease": sum(1 for k in self.tally.kills if k["holding_lease"]),
            "concurrent_starts_tried": len(dagster_tries) + len(outside),
            "concurrent_dagster": {"tried": len(dagster_tries), "waited": sum(t["waited"] for t in dagster_tries),
                                   "busy": sum(t["busy"] for t in dagster_tries),
                                   "unclean": [t for t in dagster_tries if not t["clean"]]},
            "concurrent_outside": {"tried": len(outside), "waited": sum(bool(o.get("waited")) for o in outside),
                                   "busy": sum(o["outcome"] == "busy" for o in outside),
                                   "unclean": [o for o in outside if not o["clean"]]},
            "outages": len(self.tally.outages),
            "outages_detected": sum(o["detected_after_s"] is not None for o in self.tally.outages),
            "outages_recovered": sum(o["enabled"] for o in self.tally.outages),
            "outage_detail": self.tally.outages,
            "conservation_ok": all(b["conservation"] and b["intake_matches"] for b in books.values()),
            "one_place_ok": all(b["one_place"] for b in books.values()),
            "conservation": {q: b["line"] for q, b in books.items()},
            **delivered,
            "unexplained_run_failures": unclean_failures,
            "runs_failed_on_commit_conflict": conflicts,
            "enqueue_commit_conflicts": self.producer_conflicts,
            "left_waiting": left,
            "cycle_medians_s_per_message": {q: e["s_per_message"] for q, e in times["per_queue"].items()},
            "cycle_medians_duration_s": {q: e["duration_s"] for q, e in times["per_queue"].items()},
            "cycles_per_third": {q: e["cycles"] for q, e in times["per_queue"].items()},
            "cycles_first_last_third": times["cycles"],
            "cycle_growth": growth,
            "cycle_growth_target": times["growth_target"],
            "correct": ok,
            "within_target": ok and growth is not None and growth <= times["growth_target"],
        }

    def unexplained_failures(self, instance: DagsterInstance,
                             runs: list[dg.RunInfo]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """Failed runs that are neither killed by the soak, nor a concurrent start that found the queue
        busy, nor a queue_disabled alert (which fails by design so that it shows in red); those that
        failed because a commit lost a race to a concurrent one (delta-rs's CommitFailedError: a
        known defect, counted apart so that the soak still sees any other kind) come second."""
        killed = {k["run_id"] for k in self.tally.kills}
        found: list[dict[str, str]] = []
        conflicts: list[dict[str, str]] = []
        for run in runs:
            if run.status != "FAILURE" or run.run_id in killed or run.job.endswith("__queue_disabled_alert"):
                continue
            text = dg.run_log_text(instance, run.run_id)
            if "is busy" in text and run.tags.get("poison_pipeline/soak") == "concurrent":
                continue
            failure = {"run_id": run.run_id, "job": run.job, "error": text[:1500]}
            (conflicts if "CommitFailedError" in text else found).append(failure)
        return found, conflicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 30)),
                        help="how long messages arrive (default $SOAK_MINUTES or 30)")
    length.add_argument("--seconds", type=float, default=None, help="the same in seconds (the test's profile)")
    parser.add_argument("--queues", default=",".join(QUEUES), help="the example queues to run (default: all)")
    parser.add_argument("--drain-seconds", type=float, default=180.0,
                        help="how long the sensors get to empty the queues once the producer stops")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--workdir", default=None, help="keep everything here (default: a temporary folder)")
    parser.add_argument("--no-record", action="store_true", help=f"do not append the line to {RESULTS}")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown or ("checkout" in queues) != ("shipping" in queues):
        parser.error(f"--queues: choose among {', '.join(QUEUES)} (checkout sends to shipping: both or neither)")
    if seconds < 45:
        parser.error("--seconds: at least 45 (a kill, an outage and a concurrent start need that much)")
    outcome: dict[str, Any] = {}

    def stopped(signum: int, _: object) -> None:
        raise SystemExit(128 + signum)  # so that the finally blocks stop what the soak started

    signal.signal(signal.SIGTERM, stopped)

    def compute(folder: str) -> dict[str, Any]:
        outcome.update(Soak(Path(folder), seconds, queues, args.seed, args.drain_seconds).run())
        return outcome

    status = emit(compute, args.workdir, "soak-")
    if not args.no_record:
        RESULTS.parent.mkdir(exist_ok=True)
        with RESULTS.open("a") as out:
            out.write(json.dumps(outcome) + "\n")
    return status if outcome.get("correct") else 1


if __name__ == "__main__":
    sys.exit(main())
