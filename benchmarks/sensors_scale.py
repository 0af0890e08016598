"""What every sensor and asset check of a queue costs with 1,000,000 messages waiting in 10,000 files
and 10,000 commits in the inbound log, without Spark: the target is at most 1 s for each.

Data (not timed, kept with `--workdir`): `--messages` enqueued through the product's own `enqueue`
in `--files` enqueues (one Delta file and one commit each, and one intake commit each, as a queue
fills between maintenance runs: no compaction or checkpoint other than what every commit does),
`--failed` rows in each of retry_1, poison, dead_letter and the processed ledger, and `--events`
messages_failed events, one commit each, as failing cycles leave them.

Timed, `--rounds` rounds: each round first enqueues 10 messages (a new commit, so a sensor has
something new to decide on), then evaluates every sensor of the queue's Dagster definitions through
`build_sensor_context` with a real (temporary, SQLite) instance and the cursor of its previous
evaluation (none in the first round), and every asset check function as the Dagster step calls it.
Prints one JSON line: median and max milliseconds of each, and the worst median against the target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import pyarrow as pa  # noqa: E402
from checks_cost import QUEUE, bench_declaration, fill_failed  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from dagster import DagsterInstance, SensorDefinition, SensorResult, build_sensor_context  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from poison_pipeline.defs.build import build_definitions  # noqa: E402
from poison_pipeline.domain.alerts import MESSAGES_FAILED  # noqa: E402
from poison_pipeline.domain.declaration import Declaration  # noqa: E402
from poison_pipeline.domain.envelope import parse_envelope  # noqa: E402
from poison_pipeline.domain.routing import INBOUND, PROCESSED  # noqa: E402
from poison_pipeline.engine.dedup import HASH_COLUMN, id_hashes  # noqa: E402
from poison_pipeline.operations.checks import (  # noqa: E402
    DEAD_LETTER_GROWTH,
    POISON_GROWTH,
    check_conservation,
    check_growth,
    check_oldest_waiting,
    check_one_place,
)
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.control import event_row  # noqa: E402
from poison_pipeline.storage.enqueue import enqueue, message_rows  # noqa: E402
from poison_pipeline.storage.intake import ENQUEUE, ensure_intake, record_intake  # noqa: E402
from poison_pipeline.storage.tables import EVENTS, INTAKE, QueueTables  # noqa: E402

TARGET_MS = 1000.0
SEEDED = "seeded.json"


def _records(count: int) -> list[dict[str, Any]]:
    # Random ids, as many producers make them: a file's id range then spans the whole key space, so
    # no file can be skipped by its statistics (time-ordered ids would flatter one_place). About 200
    # bytes of JSON body each, as the workload.
    return [{"message_id": uuid.uuid4().hex, "message_type": "order", "body": {"n": i, "pad": "x" * 150}}
            for i in range(count)]


def _fill_processed(tables: QueueTables, rows: int) -> None:
    now = datetime.now(UTC)
    for part in range(10):
        ids = [f"done-{part}-{i}" for i in range(rows // 10)]
        batch = f"bench-processed-{part}"
        data = pa.table({"message_id": ids, HASH_COLUMN: id_hashes(ids)})
        data = schemas.project(data, schemas.PROCESSED, conversation_id=None, message_type="order",
                               disposition="processed", from_table=INBOUND, batch_id=batch, total_abort_count=0,
                               move_count=0, at=now, date=now.date().isoformat(), cycle_seq=part)
        tables.append(PROCESSED, data)
        record_intake(tables, "benchmark", batch, data.num_rows, now)


def _fill_events(tables: QueueTables, events: int) -> None:
    for seq in range(events):
        row = event_row(MESSAGES_FAILED, datetime.now(UTC), "poison_pipeline", f"inbound cycle {seq} poisoned 1",
                        f"m-{seq}-0", INBOUND, run_id="manual", cycle_seq=seq, failures="[]")
        tables.append(EVENTS, pa.Table.from_pylist([row], schema=schemas.EVENTS))


def _direct_enqueue(declaration: Declaration) -> Callable[[list[dict[str, Any]]], None]:
    """What `enqueue` commits (the same rows, one inbound and one intake commit per batch, each
    commit's checkpoint hook), written through table handles kept open: `enqueue` opens both
    tables again for every batch, which dominates seeding once their logs are long."""
    tables = QueueTables.of(declaration, QUEUE)
    tables.ensure()
    ensure_intake(tables)
    inbound, intake = tables.open(INBOUND), tables.open(INTAKE)
    policy = declaration.queue(QUEUE).policy

    def write(records: list[dict[str, Any]]) -> None:
        now = datetime.now(UTC)
        envelopes = [parse_envelope(r, now, policy.time_to_live, policy.max_body_bytes) for r in records]
        batch = f"enq-{uuid.uuid4().hex}"
        write_deltalake(inbound, message_rows(envelopes, batch, now), mode="append")
        row = {"batch_id": batch, "source": ENQUEUE, "messages": len(envelopes), "at": now}
        write_deltalake(intake, pa.Table.from_pylist([row], schema=schemas.INTAKE), mode="append")

    return write


def seed(declaration: Declaration, workdir: str, messages: int, files: int, failed: int, events: int,
         direct: bool) -> float:
    """Build the lake; seconds taken. A half-built lake (killed while seeding) is refused, not measured."""
    tables = QueueTables.of(declaration, QUEUE)
    if tables.exists(INBOUND):
        raise SystemExit(f"{workdir} holds a lake that was not fully seeded (no {SEEDED}): remove it or pick "
                         "another --workdir")
    started = time.perf_counter()
    per_file = messages // files
    write = _direct_enqueue(declaration) if direct else None
    for f in range(files):
        records = _records(per_file)
        if write is not None:
            write(records)
        else:
            assert enqueue(declaration, QUEUE, records).accepted == per_file
        if f and f % 500 == 0:
            spent = time.perf_counter() - started
            print(f"seeded {f} of {files} enqueues in {spent:.0f} s ({spent / f * 1000:.0f} ms each)",
                  file=sys.stderr, flush=True)
    fill_failed(declaration, failed)
    _fill_processed(tables, failed)
    _fill_events(tables, events)
    return time.perf_counter() - started


def _evaluate(sensor: SensorDefinition, instance: DagsterInstance, cursor: str | None) -> SensorResult:
    result = sensor(build_sensor_context(instance=instance, cursor=cursor, sensor_name=sensor.name))
    assert isinstance(result, SensorResult), f"{sensor.name} returned {result!r}"
    return result


def _checks(declaration: Declaration, tables: QueueTables) -> dict[str, Any]:
    """Each check function of operations/checks.py, as the Dagster step (defs/checks.py) calls it."""
    oldest = declaration.queue(QUEUE).checks.oldest_waiting
    checks: dict[str, Any] = {
        "conservation": lambda: check_conservation(tables),
        "one_place": lambda: check_one_place(tables),
        "poison_growth": lambda: check_growth(tables, POISON_GROWTH, 100, None),
        "dead_letter_growth": lambda: check_growth(tables, DEAD_LETTER_GROWTH, 100, None),
    }
    for table in tables.waiting:
        checks[f"oldest_waiting_{table}"] = lambda table=table: check_oldest_waiting(tables, table, oldest)
    return checks


def _log_shape(tables: QueueTables, table: str) -> dict[str, Any]:
    """The inbound log as an opener sees it: its version, files, and the commits after the last checkpoint."""
    log = os.path.join(tables.uri(table), "_delta_log")
    version = tables.open(table).version()
    checkpoint = None
    if os.path.exists(os.path.join(log, "_last_checkpoint")):
        with open(os.path.join(log, "_last_checkpoint")) as handle:
            checkpoint = json.load(handle)["version"]
    return {"version": version, "files": len(tables.open(table).file_uris()), "last_checkpoint": checkpoint,
            "commits_to_replay": version - (checkpoint if checkpoint is not None else -1)}


def run(workdir: str, messages: int, files: int, failed: int, events: int, rounds: int,
        direct: bool) -> dict[str, Any]:
    load_start = os.getloadavg()
    declaration = bench_declaration(workdir)
    tables = QueueTables.of(declaration, QUEUE)
    marker = os.path.join(workdir, SEEDED)
    if os.path.exists(marker):  # a kept --workdir is measured again as it is
        with open(marker) as handle:
            seeded = json.load(handle)
    else:
        seed_s = seed(declaration, workdir, messages, files, failed, events, direct)
        seeded = {"messages": messages, "files": files, "failed": failed, "events": events,
                  "through": "direct commits" if direct else "enqueue", "seed_s": round(seed_s, 1)}
        with open(marker, "w") as handle:
            json.dump(seeded, handle)
    sensors = list(build_definitions(declaration).sensors or [])
    checks = _checks(declaration, tables)
    times: dict[str, list[float]] = {name: [] for name in [s.name for s in sensors] + list(checks)}
    # CPU time of this process (all its threads): on a machine shared with other work, a hint of
    # what the wall time would be on a quiet one.
    cpu_times: dict[str, list[float]] = {name: [] for name in times}
    cursors: dict[str, str | None] = {s.name: None for s in sensors}
    requested: dict[str, int] = {s.name: 0 for s in sensors}
    outcomes: dict[str, bool] = {}
    home = os.path.join(workdir, "dagster_home")
    os.makedirs(home, exist_ok=True)
    with DagsterInstance.local_temp(tempdir=home) as instance:
        for _ in range(rounds):
            enqueue(declaration, QUEUE, _records(10))
            for sensor in sensors:
                started, cpu = time.perf_counter(), time.process_time()
                result = _evaluate(sensor, instance, cursors[sensor.name])
                times[sensor.name].append(time.perf_counter() - started)
                cpu_times[sensor.name].append(time.process_time() - cpu)
                cursors[sensor.name] = result.cursor
                requested[sensor.name] += len(result.run_requests or [])
            for name, check in checks.items():
                started, cpu = time.perf_counter(), time.process_time()
                outcomes[name] = check().passed
                times[name].append(time.perf_counter() - started)
                cpu_times[name].append(time.process_time() - cpu)
    median_ms = {name: round(statistics.median(t) * 1000, 1) for name, t in times.items()}
    max_ms = {name: round(max(t) * 1000, 1) for name, t in times.items()}
    worst = max(median_ms, key=lambda name: median_ms[name])
    return {
        "benchmark": "sensors_scale",
        "messages_waiting": tables.open(INBOUND).count(),
        "inbound_log": _log_shape(tables, INBOUND),
        "intake_log": _log_shape(tables, "intake"),
        "seeded": seeded,
        "rounds": rounds,
        "median_ms": median_ms,
        "max_ms": max_ms,
        "cpu_median_ms": {name: round(statistics.median(t) * 1000, 1) for name, t in cpu_times.items()},
        "runs_requested": requested,
        "checks_passed": outcomes,
        "worst": worst,
        "worst_median_ms": median_ms[worst],
        "worst_max_ms": max(max_ms.values()),
        "target_ms": TARGET_MS,
        "within_target": median_ms[worst] <= TARGET_MS,
        "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10_000, help="enqueues (one file and commit each)")
    parser.add_argument("--failed", type=int, default=10_000,
                        help="rows in each of retry_1, poison, dead_letter and processed")
    parser.add_argument("--events", type=int, default=1_000, help="messages_failed events, one commit each")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--direct-seed", action="store_true",
                        help="seed with enqueue's rows and commits through kept table handles (faster)")
    parser.add_argument("--quick", action="store_true", help="50,000 messages in 300 files (CI)")
    parser.add_argument("--workdir", default=None, help="keep the seeded lake here; a kept lake is measured again")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.files, args.failed, args.events, args.rounds = 50_000, 300, 1_000, 100, 3
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    return emit(lambda folder: run(folder, args.messages, args.files, args.failed, args.events, args.rounds,
                                   args.direct_seed),
                args.workdir, "sensors-scale-")


if __name__ == "__main__":
    sys.exit(main())
