"""A Dagster run of a 100-message cycle against a running Spark Connect server (issue 10, item 2).

Starts a Connect server from pyspark's own script (as `make ui` does), then times real Dagster runs
of the product's own cycle job: each from a fresh process, as the run launcher starts one (Python
start, imports, the code location's definitions, a real DagsterInstance in a temporary DAGSTER_HOME,
`execute_job`), the runs sharing one server session as `make ui`'s do. The first run warms that
session's Python workers and is reported apart; the target is the median of the others. The same
run embedded (`local[*]`, a JVM per run: what every UI run paid before) is timed too, for the ratio.

    python benchmarks/connect_run.py [--quick] [--rounds N] [--embedded-rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from poison_pipeline.defs.resources import REMOTE_ENV
from poison_pipeline.domain.declaration import CONFIG_ENV, SparkSettings

HERE = Path(__file__).resolve().parent

TARGET_S = 3.0
MESSAGES = 100
QUEUE = "bench"
SPARK = SparkSettings(master="local[*]", config={"spark.sql.shuffle.partitions": "2"})


def cycle_job(config: str) -> Any:
    """The product's own inbound cycle job of the declaration file (target of a reconstructable job)."""
    from poison_pipeline.defs.build import build_definitions
    from poison_pipeline.defs.naming import job_name
    from poison_pipeline.domain.declaration import load_declaration

    return build_definitions(load_declaration(config)).resolve_job_def(job_name(QUEUE, "inbound"))


def child(config: str) -> None:
    """One run, in this fresh process: what the run launcher's worker process does."""
    started = time.perf_counter()
    from dagster import DagsterInstance, build_reconstructable_job, execute_job

    job = build_reconstructable_job("connect_run", "cycle_job", reconstructable_args=(config,))
    with DagsterInstance.get() as instance:
        ready = time.perf_counter()
        result = execute_job(job, instance)
        done = time.perf_counter()
    print(json.dumps({"success": result.success, "imports_s": ready - started, "execute_job_s": done - ready}),
          flush=True)


def _enqueue(config: str, round_: int) -> None:
    from poison_pipeline.domain.declaration import load_declaration
    from poison_pipeline.storage.enqueue import enqueue

    records = [{"message_id": f"r{round_}-{i}", "message_type": "order",
                "body": {"kind": "poison" if i == 0 else "ok", "order_id": i}} for i in range(MESSAGES)]
    assert not enqueue(load_declaration(config), QUEUE, records).refused


def _timed_run(config: str, env: dict[str, str], round_: int) -> dict[str, float]:
    _enqueue(config, round_)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(Path(__file__)), "--child", config], env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines or not json.loads(lines[-1])["success"]:
        raise RuntimeError(f"the run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return {"process_s": wall, **json.loads(lines[-1])}


def _median(runs: list[dict[str, float]], key: str) -> float | None:
    return round(statistics.median(r[key] for r in runs), 3) if runs else None


def run(rounds: int, embedded_rounds: int, workdir: str) -> dict[str, Any]:
    import yaml

    from poison_pipeline.engine.local_servers import start_connect_server

    load_start = os.getloadavg()
    folder = Path(workdir)
    home = folder / "dagster_home"
    home.mkdir(parents=True)
    config = folder / "declaration.yaml"
    config.write_text(yaml.safe_dump({
        "lake_root": str(folder / "lake"), "spark": SPARK.model_dump(),
        "queues": {QUEUE: {"handler": "bench_handler:handle", "policy": {
            "receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0,
            "receive_error_handling": "move"}}},
    }))
    env = {**os.environ, "DAGSTER_HOME": str(home), CONFIG_ENV: str(config),
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    started = time.perf_counter()
    with start_connect_server(SPARK, folder / "connect", pythonpath=[str(HERE)]) as server:
        server_start = time.perf_counter() - started
        shared = {**env, REMOTE_ENV: server.session_url()}
        connect = [_timed_run(str(config), shared, n) for n in range(rounds + 1)]
    embedded = [_timed_run(str(config), env, rounds + 1 + n) for n in range(embedded_rounds)]
    warm = connect[1:]
    median = _median(warm, "process_s")
    embedded_median = _median(embedded, "process_s")
    return {
        "benchmark": "connect_run",
        "messages": MESSAGES,
        "rounds": rounds,
        "connect_run_s": median,
        "connect_execute_job_s": _median(warm, "execute_job_s"),
        "connect_imports_s": _median(warm, "imports_s"),
        "connect_first_run_s": round(connect[0]["process_s"], 3),
        "connect_runs_s": [round(r["process_s"], 3) for r in warm],
        "server_start_s": round(server_start, 3),
        "embedded_run_s": embedded_median,
        "embedded_over_connect": round(embedded_median / median, 2) if embedded_median and median else None,
        "target_s": TARGET_S,
        "within_target": median is not None and median <= TARGET_S,
        "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 timed runs and 1 embedded (CI)")
    parser.add_argument("--rounds", type=int, default=None, help="timed Connect runs after the warm-up run")
    parser.add_argument("--embedded-rounds", type=int, default=None)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    # Imported here: a run's process imports this module for its job and should pay only the product's imports.
    sys.path.insert(0, str(HERE))
    from cycle_throughput import emit

    rounds = args.rounds or (2 if args.quick else 7)
    embedded_rounds = args.embedded_rounds if args.embedded_rounds is not None else (1 if args.quick else 3)
    return emit(lambda folder: run(rounds, embedded_rounds, folder), args.workdir, "connect-run-")


if __name__ == "__main__":
    sys.exit(main())
