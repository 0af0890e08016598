"""Small cycles: 100 messages enqueued and cycled, in a warm session and as a Dagster run.

    .venv/bin/python benchmarks/small_cycle.py [--quick] [--rounds N] [--messages M] [--dagster-runs K]

In one Spark session (local[*]): one cold cycle (the first of the session), then N rounds of
`enqueue` of M messages (1% poison, 0.5% transient, as `cycle_throughput`) + `run_cycle`, each
round once on the small-cycle path (the declaration's default) and once with
`small_cycles.max_messages: 0` (every cycle a Spark job) on a twin queue. Each cycle's phases are
timed, and its Spark jobs and Delta commits counted. Then K Dagster runs of the product's cycle job
(`bench__inbound_cycle`, with its checks step) over M fresh messages, each in a fresh process with a
real DagsterInstance (as the run launcher starts one): the process's wall time is what a run costs.

Prints one JSON line on stdout; everything else goes to stderr.
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

import yaml

HERE = Path(__file__).resolve().parent
# Spark's workers, the small cycles' fork server and the Dagster run's process import the handler.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(HERE))

import bench_handler  # noqa: E402
from cycle_throughput import POLICY, body_of, emit, phase_clock  # noqa: E402
from deltalake import DeltaTable  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SmallCycles, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine import cycle as cycle_module  # noqa: E402
from poison_pipeline.engine import local  # noqa: E402
from poison_pipeline.engine import recovery as recovery_module  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations import cycle as operations_cycle  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402
from poison_pipeline.storage.lease import Lease  # noqa: E402
from poison_pipeline.storage.tables import INTAKE, QueueTables  # noqa: E402

TARGET_CYCLE_S = 1.0
TARGET_DAGSTER_RUN_S = 15.0
SPARK_PATH = "spark_path"
# What the cycle does besides delivering, timed by name (see cycle_throughput.phase_clock).
EXTRA_PHASES = [
    (operations_cycle, "complete_interrupted", "recover: interrupted operator actions"),
    (cycle_module, "queue_state", "select: queue state (events)"),
    (cycle_module, "retry_cleanups", "select: clean-up hooks to retry"),
    (cycle_module, "ended_conversations", "select: ended conversations"),
    (cycle_module, "unfinished_cleanups", "after: unfinished clean-ups"),
    (cycle_module, "pending_count", "after: pending sends"),
    (cycle_module, "write_entry", "journal writes"),
    (recovery_module, "write_entry", "journal writes"),
    (local, "stage", "deliver+stage: small-cycle worker process"),
    (QueueTables, "ensure", "ensure: every table exists"),
    (Lease, "acquire", "lease: acquire"),
    (Lease, "release", "lease: release"),
]
# Timed inside another phase (apply_staged): not added again to what the phases account for.
NESTED = ("commit: build attempt rows (arrow)", "commit: delta ")


def records(prefix: str, count: int) -> list[dict[str, Any]]:
    return [{"message_id": f"{prefix}-{i:05d}", "message_type": "bench.order", "body": json.loads(body_of(i))}
            for i in range(count)]


def versions(tables: QueueTables) -> dict[str, int]:
    found = {}
    for table in (*tables.all_tables, INTAKE, "_lease"):
        if tables.exists(table):
            found[table] = DeltaTable(tables.uri(table)).version()
    return found


def one_cycle(spark: Any, declaration: Declaration, queue: str, label: str) -> dict[str, Any]:
    """One timed cycle, with its phases, Spark jobs and Delta commits (counted outside the timing)."""
    tables = QueueTables.of(declaration, queue)
    before = versions(tables)
    context = spark.sparkContext
    context.setJobGroup(label, label)
    with phase_clock(EXTRA_PHASES) as spent:
        started = time.perf_counter()
        report = run_cycle(spark, declaration, queue, "inbound", run_id=label)
        seconds = time.perf_counter() - started
    if report.skipped:
        raise RuntimeError(f"{label}: the cycle did nothing: {report.skipped}")
    after = versions(tables)
    commits = {t: v - before.get(t, -1) for t, v in after.items() if v != before.get(t, -1)}
    jobs = len(context.statusTracker().getJobIdsForGroup(label))
    phases = dict(spent)
    phases["other (unaccounted)"] = seconds - sum(v for k, v in spent.items() if not k.startswith(NESTED))
    return {"seconds": seconds, "phases": phases, "spark_jobs": jobs, "delta_commits": commits,
            "counts": report.counts}


def summary(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    times = sorted(c["seconds"] for c in cycles)
    phases: dict[str, list[float]] = {}
    for cycle in cycles:
        for name, spent in cycle["phases"].items():
            phases.setdefault(name, []).append(spent)
    last = cycles[-1]
    return {
        "median_s": round(statistics.median(times), 3),
        "p90_s": round(times[min(len(times) - 1, round(0.9 * (len(times) - 1)))], 3),
        "best_s": round(times[0], 3),
        "phases_median_s": {k: round(statistics.median(v + [0.0] * (len(cycles) - len(v))), 3)
                            for k, v in sorted(phases.items())},
        "spark_jobs_per_cycle": last["spark_jobs"],
        "delta_commits_per_cycle": sum(last["delta_commits"].values()),
        "delta_commits_by_table": last["delta_commits"],
        "counts": {k: int(v) for k, v in last["counts"].items()},
    }


# --- a Dagster run in a fresh process ---------------------------------------------------------------


def job_of(config: str, name: str) -> Any:
    """The product's job, from the definitions of a declaration file (the reconstructable target)."""
    from poison_pipeline.defs.build import build_definitions
    from poison_pipeline.domain.declaration import load_declaration

    return build_definitions(load_declaration(config)).resolve_job_def(name)


def run_job(config: str, name: str) -> dict[str, Any]:
    """What the run's process does: load the code, execute the job with a real instance."""
    started = time.perf_counter()
    from dagster import DagsterInstance, build_reconstructable_job, execute_job

    # By keyword: Dagster annotates the positional arguments `tuple[object]`, a single one.
    job = build_reconstructable_job("small_cycle", "job_of", reconstructable_kwargs={"config": config, "name": name})
    loaded = time.perf_counter() - started
    with DagsterInstance.get() as instance:
        clock = time.perf_counter()
        with execute_job(job, instance) as result:
            if not result.success:
                raise RuntimeError(f"the Dagster run {result.run_id} failed")
            stats = instance.get_run_stats(result.run_id)
            assert stats.start_time is not None and stats.end_time is not None  # a finished run
            steps = {s.step_key: round(s.end_time - s.start_time, 3) for s in instance.get_run_step_stats(result.run_id)
                     if s.start_time and s.end_time}
    return {"import_s": round(loaded, 3), "execute_s": round(time.perf_counter() - clock, 3),
            "run_s": round(stats.end_time - stats.start_time, 3), "steps_s": steps}


def dagster_runs(declaration: Declaration, workdir: str, runs: int, messages: int) -> dict[str, Any]:
    config = Path(workdir) / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    home = Path(workdir) / "dagster_home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    measured = []
    for run in range(runs):
        enqueue(declaration, bench_handler.QUEUE, records(f"dagster{run}", messages))
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--run-job", str(config), "bench__inbound_cycle"],
                              env=env, stdout=subprocess.PIPE, check=True)
        wall = time.perf_counter() - started
        measured.append({"process_s": round(wall, 3), **json.loads(done.stdout.decode().strip().splitlines()[-1])})
        print(f"dagster run {run}: {measured[-1]}", file=sys.stderr)
    walls = [m["process_s"] for m in measured]
    return {"median_s": round(statistics.median(walls), 3), "runs": measured}


# --- the benchmark ------------------------------------------------------------------------------------


def run(rounds: int, messages: int, runs: int, workdir: str) -> dict[str, Any]:
    load_start = os.getloadavg()
    declaration = parse_declaration({
        "lake_root": os.path.join(workdir, "lake"),
        "queues": {name: {"handler": bench_handler.HANDLER, "policy": POLICY}
                   for name in (bench_handler.QUEUE, SPARK_PATH)},
    })
    on_spark = declaration.model_copy(update={"small_cycles": SmallCycles(max_messages=0)})
    started = time.perf_counter()
    spark = build_session(SparkSettings(app_name="small_cycle"))
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - started
    try:
        enqueue(declaration, bench_handler.QUEUE, records("cold", messages))
        cold = one_cycle(spark, declaration, bench_handler.QUEUE, "cold")
        # The Spark path's first cycle starts its Python workers: not one of its timed rounds.
        enqueue(on_spark, SPARK_PATH, records("warm", messages))
        one_cycle(spark, on_spark, SPARK_PATH, "warm")
        small, spark_path = [], []
        for index in range(rounds):
            enqueue(declaration, bench_handler.QUEUE, records(f"r{index}", messages))
            small.append(one_cycle(spark, declaration, bench_handler.QUEUE, f"small-{index}"))
            enqueue(on_spark, SPARK_PATH, records(f"r{index}", messages))
            spark_path.append(one_cycle(spark, on_spark, SPARK_PATH, f"spark-{index}"))
            print(f"round {index}: small path {small[-1]['seconds']:.3f}s, "
                  f"Spark path {spark_path[-1]['seconds']:.3f}s", file=sys.stderr)
    finally:
        spark.stop()
    dagster = dagster_runs(declaration, workdir, runs, messages)
    result: dict[str, Any] = {
        "benchmark": "small_cycle",
        "messages": messages,
        "rounds": rounds,
        "small_cycles_max_messages": declaration.small_cycles.max_messages,
        "session_start_s": round(session_s, 3),
        "first_cycle_s": round(cold["seconds"], 3),
        "first_cycle_phases_s": {k: round(v, 3) for k, v in sorted(cold["phases"].items())},
        "cycle": summary(small),
        "cycle_spark_path": summary(spark_path),
        "dagster_run": dagster,
        "target_cycle_s": TARGET_CYCLE_S,
        "target_dagster_run_s": TARGET_DAGSTER_RUN_S,
    }
    result["within_target"] = (result["cycle"]["median_s"] <= TARGET_CYCLE_S
                               and dagster["median_s"] <= TARGET_DAGSTER_RUN_S)
    result["load_avg"] = {"start": load_start, "end": os.getloadavg()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds and one Dagster run (for CI)")
    parser.add_argument("--rounds", type=int, default=None, help="timed cycles per path (default 20)")
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--dagster-runs", type=int, default=None, help="Dagster runs (default 3)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--run-job", nargs=2, metavar=("CONFIG", "JOB"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_job:
        # The child of dagster_runs: its last stdout line is its own timing.
        print(json.dumps(run_job(*args.run_job)))
        return 0
    rounds = args.rounds or (3 if args.quick else 20)
    runs = args.dagster_runs or (1 if args.quick else 3)
    if rounds < 1 or runs < 1 or args.messages < 1:
        parser.error("--rounds, --dagster-runs and --messages must be at least 1")
    return emit(lambda workdir: run(rounds, args.messages, runs, workdir), args.workdir, "small_cycle-")


if __name__ == "__main__":
    sys.exit(main())
