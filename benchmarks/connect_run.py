"""A Dagster run of a 100-message cycle against a running Spark Connect server (issue 10, item 2).

What a user of `make ui` gets: a Spark Connect server started from pyspark's own script, `dagster
dev` (webserver and daemon) on a DAGSTER_HOME holding the repo's dagster.yaml (its run launcher, run
queue and monitoring) with the runs pointed at that server, and each run of the product's own
inbound cycle job launched as the UI's Launchpad launches it (GraphQL `launchRun`): queued, taken by
the daemon's run queue, handed to the run launcher, run. A run's time is from the launch request to
its RUN_SUCCESS event; the split comes from the run's own events (queued, launched, its process
logged "Started process", the steps by Dagster's clock). The first run of a `dagster dev` starts
the warm process and is reported apart; the target is the median of the others. The same runs with
Dagster's DefaultRunLauncher (the code server spawns a fresh process per run: what every run paid
before) are timed on a second `dagster dev`, for the ratio.

    python benchmarks/connect_run.py [--quick] [--rounds N] [--default-rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import soak_dagster as dg  # noqa: E402
import yaml  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus  # noqa: E402

from poison_pipeline.defs.naming import job_name  # noqa: E402
from poison_pipeline.defs.resources import REMOTE_ENV  # noqa: E402
from poison_pipeline.domain.declaration import SparkSettings, load_declaration  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402

TARGET_S = 3.0
MESSAGES = 100
QUEUE = "bench"
SPARK = SparkSettings(master="local[*]", config={"spark.sql.shuffle.partitions": "2"})
RUN_TIMEOUT_S = 300.0
_DONE = (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def _enqueue(config: Path, round_: int) -> None:
    records = [{"message_id": f"r{round_}-{i}", "message_type": "order",
                "body": {"kind": "poison" if i == 0 else "ok", "order_id": i}} for i in range(MESSAGES)]
    assert not enqueue(load_declaration(config), QUEUE, records).refused


def _split(instance: DagsterInstance, run_id: str, requested: float) -> dict[str, Any]:
    """The run's time from the launch request to RUN_SUCCESS, split by its own events."""
    at: dict[str, float] = {}
    steps: dict[str, float] = {}
    step_start: dict[str, float] = {}
    for event in instance.all_logs(run_id):
        kind = event.dagster_event.event_type if event.dagster_event else None
        if kind in (DagsterEventType.RUN_DEQUEUED, DagsterEventType.RUN_STARTING, DagsterEventType.RUN_START,
                    DagsterEventType.RUN_SUCCESS):
            at.setdefault(kind.value, event.timestamp)
        elif kind == DagsterEventType.ENGINE_EVENT and "Started process for run" in (event.message or ""):
            at.setdefault("WORKER", event.timestamp)
        elif kind == DagsterEventType.STEP_START:
            step_start[str(event.step_key)] = event.timestamp
        elif kind in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE) and event.step_key in step_start:
            steps[str(event.step_key)] = round(event.timestamp - step_start[str(event.step_key)], 3)
    launched = at.get("PIPELINE_STARTING", at.get("RUN_STARTING"))
    started, done = at.get("PIPELINE_START", at.get("RUN_START")), at.get("PIPELINE_SUCCESS", at.get("RUN_SUCCESS"))
    if launched is None or started is None or done is None or "WORKER" not in at:
        raise RuntimeError(f"run {run_id} lacks its start or success events: {sorted(at)}")
    return {"run_s": done - requested, "queued_s": launched - requested, "launch_s": at["WORKER"] - launched,
            "worker_to_start_s": started - at["WORKER"], "dagster_run_s": done - started, "steps_s": steps}


def _timed_run(server: dg.DagsterDev, instance: DagsterInstance, config: Path, round_: int) -> dict[str, Any]:
    _enqueue(config, round_)
    requested = time.time()
    run_id = server.launch(job_name(QUEUE, "inbound"))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (run := instance.get_run_by_id(run_id)) is None or run.status not in _DONE:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} did not end within {RUN_TIMEOUT_S:.0f} s:\n{server.tail()}")
        time.sleep(0.05)
    if run.status != DagsterRunStatus.SUCCESS:
        raise RuntimeError(f"run {run_id} ended {run.status.value}:\n{dg.run_log_text(instance, run_id)[-4000:]}")
    return _split(instance, run_id, requested)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    return round(statistics.median(r[key] for r in runs), 3) if runs else None


def _steps(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = sorted({k for r in runs for k in r["steps_s"]})
    return {k: round(statistics.median(r["steps_s"][k] for r in runs if k in r["steps_s"]), 3) for k in keys}


def _deployment(folder: Path, config: Path, remote: str, launcher: str, rounds: int,
                first_round: int) -> dict[str, Any]:
    """`rounds` + 1 runs on a `dagster dev` of its own; `launcher` "warm" (the repo's dagster.yaml)
    or "default" (the same without its run_launcher: Dagster's DefaultRunLauncher)."""
    home = dg.dagster_home(folder / launcher)
    settings = yaml.safe_load((home / "dagster.yaml").read_text())
    if launcher == "default":
        settings.pop("run_launcher", None)
        (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    env = {REMOTE_ENV: remote,
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    server = dg.DagsterDev(home, config, folder / "app", folder / f"dagster_dev_{launcher}.log", env=env)
    try:
        server.wait_ready(240)
        server.stop_sensors()  # the runs timed are the ones launched here, not a sensor's beside them
        os.environ["DAGSTER_HOME"] = str(home)
        with DagsterInstance.get() as instance:
            runs = [_timed_run(server, instance, config, first_round + n) for n in range(rounds + 1)]
    finally:
        server.stop()
    warm = runs[1:]
    return {"run_s": _median(warm, "run_s"), "first_run_s": round(runs[0]["run_s"], 3),
            "runs_s": [round(r["run_s"], 3) for r in warm],
            "split_s": {key: _median(warm, key) for key in
                        ("queued_s", "launch_s", "worker_to_start_s", "dagster_run_s")},
            "steps_s": _steps(warm)}


def run(rounds: int, default_rounds: int, workdir: str) -> dict[str, Any]:
    from poison_pipeline.engine.local_servers import start_connect_server

    load_start = os.getloadavg()
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "declaration.yaml"
    config.write_text(yaml.safe_dump({
        "lake_root": str(folder / "lake"), "spark": SPARK.model_dump(),
        "queues": {QUEUE: {"handler": "bench_handler:handle", "policy": {
            "receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0,
            "receive_error_handling": "move"}}},
    }))
    started = time.perf_counter()
    with start_connect_server(SPARK, folder / "connect", pythonpath=[str(HERE)]) as server:
        server_start = time.perf_counter() - started
        remote = server.session_url()
        warm = _deployment(folder, config, remote, "warm", rounds, 0)
        default = (_deployment(folder, config, remote, "default", default_rounds, rounds + 1)
                   if default_rounds else None)
    median = warm["run_s"]
    return {
        "benchmark": "connect_run",
        "messages": MESSAGES,
        "rounds": rounds,
        "connect_run_s": median,
        "warm_launcher": warm,
        "default_launcher": default,
        "default_over_warm": round(default["run_s"] / median, 2) if default and median else None,
        "server_start_s": round(server_start, 3),
        "target_s": TARGET_S,
        "within_target": median is not None and median <= TARGET_S,
        "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 timed runs, warm launcher only (CI)")
    parser.add_argument("--rounds", type=int, default=None, help="timed runs after the first, warm launcher")
    parser.add_argument("--default-rounds", type=int, default=None,
                        help="timed runs after the first with Dagster's DefaultRunLauncher (0: none)")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 7)
    default_rounds = args.default_rounds if args.default_rounds is not None else (0 if args.quick else 3)
    return emit(lambda folder: run(rounds, default_rounds, folder), args.workdir, "connect-run-")


if __name__ == "__main__":
    sys.exit(main())
