"""What every sensor and asset check of a queue costs with 1,000,000 messages waiting in 10,000 files
and 10,000 commits in the inbound log, without Spark: the target is at most 1 s for each.

Data (not timed, kept with `--workdir`): `--messages` in `--files` enqueues, as 10,000 real `enqueue`
calls leave them (one inbound and one intake commit each, the checkpoints delta-rs writes every 100
commits), seeded by `lake_seed.seed_enqueues` in minutes instead of hours; then `--failed` rows in
each of retry_1, poison, dead_letter and the processed ledger (real appends, with their intake rows)
and `--events` messages_failed events, one commit each (seeded likewise). Before measuring, a
reference lake is made by real calls (`--reference` enqueues and event appends) and the seeded
tables are compared with it: the same kinds of log actions and keys, statistics columns, schemas,
parquet layout and checkpoint versions (`seed_differences` in the line; any difference fails).

Timed: every sensor of the queue's Definitions (through `build_sensor_context`, a real SQLite
instance, the cursor of its previous evaluation) and every asset check function as the Dagster step
calls it (the growth checks with the rows of their previous evaluation), each evaluation round in a
fresh Python process, as a Dagster run's step is (a sensor runs in the long-lived code server, so a
fresh process is the harder case for it):

- `first`: no cursor, no check cache (`_work/checks` removed): the first evaluation ever;
- `steady`: `--rounds` rounds, each after `--new` more real enqueues of 100 messages.

Prints one JSON line: milliseconds (wall and CPU) of each, and the worst of each against 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from checks_cost import QUEUE, bench_declaration, fill_failed  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from lake_seed import compare_logs, seed_appends, seed_enqueues  # noqa: E402

from poison_pipeline.domain.alerts import MESSAGES_FAILED  # noqa: E402
from poison_pipeline.domain.declaration import Declaration  # noqa: E402
from poison_pipeline.domain.routing import INBOUND, PROCESSED  # noqa: E402
from poison_pipeline.engine.dedup import HASH_COLUMN, id_hashes  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.column_cache import noted_files, notes_file  # noqa: E402
from poison_pipeline.storage.control import event_row  # noqa: E402
from poison_pipeline.storage.events import append_events, events_cache, note_events  # noqa: E402
from poison_pipeline.storage.intake import record_intake  # noqa: E402
from poison_pipeline.storage.message_ids import IDS, ids_cache, note_ids  # noqa: E402
from poison_pipeline.storage.tables import EVENTS, INTAKE, QueueTables  # noqa: E402
from poison_pipeline.storage.writer import queue_writer  # noqa: E402

TARGET_MS = 1000.0
SEEDED = "seeded.json"
STATE = "evaluations.json"
ENQUEUE_NOTES = "enqueue_notes"
EVENT_NOTES = "event_notes"
PER_ENQUEUE = 100


def _texts(count: int) -> list[str]:
    # Random ids, as many producers make them: a file's id range then spans the whole key space, so
    # no file can be skipped by its statistics (time-ordered ids would flatter one_place). About 200
    # bytes of JSON body each, as the workload.
    return [json.dumps({"message_id": uuid.uuid4().hex, "message_type": "order", "body": {"n": i, "pad": "x" * 150}})
            for i in range(count)]


def _fill_processed(tables: QueueTables, rows: int) -> None:
    now = datetime.now(UTC)
    with queue_writer(tables, "benchmark") as writer:
        for part in range(10):
            ids = [f"done-{part}-{i}" for i in range(rows // 10)]
            batch = f"bench-processed-{part}"
            data = pa.table({"message_id": ids, HASH_COLUMN: id_hashes(ids)})
            data = schemas.project(data, schemas.PROCESSED, conversation_id=None, message_type="order",
                                   disposition="processed", from_table=INBOUND, batch_id=batch,
                                   total_abort_count=0, move_count=0, at=now, date=now.date().isoformat(),
                                   cycle_seq=part)
            writer.append(PROCESSED, data)
            record_intake(writer, "benchmark", batch, data.num_rows, now)


def _events(first: int, count: int) -> list[pa.Table]:
    """messages_failed events as failing cycles write them, one commit each."""
    return [pa.Table.from_pylist([event_row(MESSAGES_FAILED, datetime.now(UTC), "poison_pipeline",
                                            f"inbound cycle {seq} poisoned 1", f"m-{seq}-0", INBOUND,
                                            run_id="manual", cycle_seq=seq, failures="[]")], schema=schemas.EVENTS)
            for seq in range(first, first + count)]


def seed(declaration: Declaration, workdir: str, messages: int, files: int, failed: int, events: int,
         through_enqueue: bool) -> float:
    """Build the lake; seconds taken. A half-built lake (killed while seeding) is refused, not measured."""
    tables = QueueTables.of(declaration, QUEUE)
    if tables.exists(INBOUND):
        raise SystemExit(f"{workdir} holds a lake that was not fully seeded (no {SEEDED}): remove it or pick "
                         "another --workdir")
    started = time.perf_counter()
    per_file = messages // files
    if through_enqueue:
        for _ in range(files):
            assert enqueue(declaration, QUEUE, _texts(per_file)).accepted == per_file
    else:
        seed_enqueues(declaration, QUEUE, [_texts(per_file) for _ in range(files)], workdir)
    fill_failed(declaration, failed)
    _fill_processed(tables, failed)
    if through_enqueue:
        with queue_writer(tables, "benchmark") as writer:
            for table in _events(0, events):
                append_events(writer, table)
    else:
        appended = _events(0, events)
        for name, table in zip(seed_appends(tables.uri(EVENTS), appended, [None] * events, workdir), appended,
                               strict=True):
            note_events(tables, name, table)
    return time.perf_counter() - started


def seed_differences(workdir: str, seeded: Declaration, enqueues: int, events: int) -> dict[str, list[str]]:
    """The seeded lake against a reference made by `enqueues` real enqueues and `events` real event
    appends (versions 1, 2, the middle and the last; checkpoints up to the shorter log)."""
    reference = bench_declaration(os.path.join(workdir, "reference"))
    tables = QueueTables.of(reference, QUEUE)
    for _ in range(enqueues):
        enqueue(reference, QUEUE, _texts(PER_ENQUEUE))
    with queue_writer(tables, "benchmark") as writer:
        for table in _events(0, events):
            append_events(writer, table)
    mine = QueueTables.of(seeded, QUEUE)
    found = {}
    for name, cache, schema, real, seeded_count in (
            ("id_notes", lambda lake: ids_cache(lake, INBOUND), IDS, enqueues, len(os.listdir(mine.uri(INBOUND))) - 1),
            ("event_notes", lambda lake: events_cache(lake, MESSAGES_FAILED), schemas.EVENTS, events,
             len(os.listdir(mine.uri(EVENTS))) - 1)):
        notes = [len(noted_files(cache(lake), schema)) for lake in (tables, mine)]
        found[name] = [] if notes == [real, seeded_count] else [
            f"{name}: real {notes[0]} for {real} commits, seeded {notes[1]} for {seeded_count} files"]
    for table, count in ((INBOUND, enqueues), (INTAKE, enqueues), (EVENTS, events)):
        found[table] = compare_logs(tables.uri(table), mine.uri(table), sorted({1, 2, count // 2, count}))
    shutil.rmtree(os.path.join(workdir, "reference"))
    return found


# ---- one evaluation round, in a process of its own ------------------------------------------------


def evaluate(workdir: str) -> None:
    """Evaluate every sensor and check once, with the cursors and growth rows of the previous round
    (in `STATE`), and add this round's timings there."""
    from dagster import DagsterInstance, SensorResult, build_sensor_context

    from poison_pipeline.defs.build import build_definitions
    from poison_pipeline.operations.checks import (
        DEAD_LETTER_GROWTH,
        POISON_GROWTH,
        check_conservation,
        check_growth,
        check_oldest_waiting,
        check_one_place,
    )

    declaration = bench_declaration(workdir)
    tables = QueueTables.of(declaration, QUEUE)
    path = os.path.join(workdir, STATE)
    with open(path) as handle:
        state = json.load(handle)
    oldest = declaration.queue(QUEUE).checks.oldest_waiting
    checks: dict[str, Any] = {
        "conservation": lambda: check_conservation(tables),
        "one_place": lambda: check_one_place(tables),
        **{name: lambda name=name: check_growth(tables, name, 100, state["rows"].get(name))
           for name in (POISON_GROWTH, DEAD_LETTER_GROWTH)},
    }
    for table in tables.waiting:
        checks[f"oldest_waiting_{table}"] = lambda table=table: check_oldest_waiting(tables, table, oldest)
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    passed: dict[str, bool] = {}
    home = os.path.join(workdir, "dagster_home")
    os.makedirs(home, exist_ok=True)
    with DagsterInstance.local_temp(tempdir=home) as instance:
        for sensor in build_definitions(declaration).sensors or []:
            started, cpu_started = time.perf_counter(), time.process_time()
            result = sensor(build_sensor_context(instance=instance, cursor=state["cursors"].get(sensor.name),
                                                 sensor_name=sensor.name))
            wall[sensor.name], cpu[sensor.name] = time.perf_counter() - started, time.process_time() - cpu_started
            assert isinstance(result, SensorResult), f"{sensor.name} returned {result!r}"
            state["cursors"][sensor.name] = result.cursor
            state["requested"][sensor.name] = state["requested"].get(sensor.name, 0) + len(result.run_requests or [])
    for name, check in checks.items():
        started, cpu_started = time.perf_counter(), time.process_time()
        outcome = check()
        wall[name], cpu[name] = time.perf_counter() - started, time.process_time() - cpu_started
        passed[name] = outcome.passed
        if "rows" in outcome.metadata:
            state["rows"][name] = outcome.metadata["rows"]
    state["rounds"].append({"wall": wall, "cpu": cpu, "passed": passed})
    with open(path, "w") as handle:
        json.dump(state, handle)


def _round(workdir: str) -> None:
    subprocess.run([sys.executable, __file__, "--evaluate", workdir], check=True, stdout=sys.stderr)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def run(workdir: str, messages: int, files: int, failed: int, events: int, rounds: int, new: int,
        reference: int, through_enqueue: bool, no_notes: bool) -> dict[str, Any]:
    load_start = os.getloadavg()
    declaration = bench_declaration(workdir)
    tables = QueueTables.of(declaration, QUEUE)
    marker = os.path.join(workdir, SEEDED)
    if os.path.exists(marker):  # a kept --workdir is measured again as it is
        with open(marker) as handle:
            seeded = json.load(handle)
    else:
        seed_s = seed(declaration, workdir, messages, files, failed, events, through_enqueue)
        seeded = {"messages": messages, "files": files, "failed": failed, "events": events,
                  "through": "enqueue" if through_enqueue else "lake_seed", "seed_s": round(seed_s, 1)}
        started = time.perf_counter()
        seeded["differences"] = seed_differences(workdir, declaration, min(reference, files), min(reference, events))
        seeded["reference_s"] = round(time.perf_counter() - started, 1)
        with open(marker, "w") as handle:
            json.dump(seeded, handle)
    # The first evaluation ever: no cursor, no cache, and the notes the enqueues left of their ids
    # and the cycles of their events (kept aside at seeding: a round takes them into the caches), as
    # 10,000 real enqueues and 1,000 failing cycles leave them; `--no-notes` measures a lake whose
    # writers left none (an older version's).
    for cache, kept in ((ids_cache(tables, INBOUND), ENQUEUE_NOTES), (events_cache(tables, MESSAGES_FAILED),
                                                                     EVENT_NOTES)):
        kept = os.path.join(workdir, kept)
        if not os.path.exists(kept) and os.path.exists(notes_file(cache)):
            shutil.copyfile(notes_file(cache), kept)
    _upgrade_kept_notes(tables, workdir)
    for work in ("checks", "sensors"):
        shutil.rmtree(tables.work_uri(work), ignore_errors=True)
    for cache, kept in ((ids_cache(tables, INBOUND), ENQUEUE_NOTES), (events_cache(tables, MESSAGES_FAILED),
                                                                     EVENT_NOTES)):
        if not no_notes and os.path.exists(os.path.join(workdir, kept)):
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            shutil.copyfile(os.path.join(workdir, kept), notes_file(cache))
    with open(os.path.join(workdir, STATE), "w") as handle:
        json.dump({"cursors": {}, "rows": {}, "requested": {}, "rounds": []}, handle)
    shape = {INBOUND: _log_shape(tables, INBOUND), INTAKE: _log_shape(tables, INTAKE)}
    _round(workdir)
    for _ in range(rounds):
        for _ in range(new):
            enqueue(declaration, QUEUE, _texts(PER_ENQUEUE))
        _round(workdir)
    with open(os.path.join(workdir, STATE)) as handle:
        state = json.load(handle)
    first, steady = state["rounds"][0], state["rounds"][1:]
    names = list(first["wall"])
    first_ms = {name: _ms(first["wall"][name]) for name in names}
    steady_ms = {name: _ms(statistics.median(r["wall"][name] for r in steady)) for name in names}
    worst_first = max(names, key=lambda n: first_ms[n])
    worst_steady = max(names, key=lambda n: steady_ms[n])
    seed_ok = not any(seeded["differences"].values())
    return {
        "benchmark": "sensors_scale",
        "messages_waiting": tables.open(INBOUND).count(),
        "inbound_log": shape[INBOUND],
        "intake_log": shape[INTAKE],
        "seeded": seeded,
        "seed_matches_real": seed_ok,
        "rounds": rounds,
        "new_enqueues_per_round": new,
        "enqueue_notes_kept": not no_notes,
        "first_ms": first_ms,
        "first_cpu_ms": {name: _ms(first["cpu"][name]) for name in names},
        "steady_median_ms": steady_ms,
        "steady_max_ms": {name: _ms(max(r["wall"][name] for r in steady)) for name in names},
        "steady_cpu_median_ms": {name: _ms(statistics.median(r["cpu"][name] for r in steady)) for name in names},
        "runs_requested": state["requested"],
        "checks_passed_last_round": state["rounds"][-1]["passed"],
        "worst_first": worst_first,
        "worst_first_ms": first_ms[worst_first],
        "worst_steady": worst_steady,
        "worst_steady_median_ms": steady_ms[worst_steady],
        "target_ms": TARGET_MS,
        "within_target_first": first_ms[worst_first] <= TARGET_MS,
        "within_target_steady": steady_ms[worst_steady] <= TARGET_MS,
        "within_target": seed_ok and max(first_ms[worst_first], steady_ms[worst_steady]) <= TARGET_MS,
        "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
        "cpus": os.cpu_count(),
    }


def _upgrade_kept_notes(tables: QueueTables, workdir: str) -> None:
    """A lake kept by an earlier version of this benchmark holds its notes in the older format (JSON
    lines of ids) and no notes of its events: write them as this version's enqueues and cycles do."""
    kept = os.path.join(workdir, ENQUEUE_NOTES)
    if os.path.exists(kept):
        with open(kept, "rb") as handle:
            older = handle.read(1) == b"{"
        if older:
            cache = ids_cache(tables, INBOUND)
            shutil.rmtree(tables.work_uri("checks"), ignore_errors=True)
            with open(kept) as handle:
                for line in handle:
                    entry = json.loads(line)
                    note_ids(tables, INBOUND, entry["path"], pa.array(entry["values"], pa.string()))
            shutil.move(notes_file(cache), kept)
    kept = os.path.join(workdir, EVENT_NOTES)
    if not os.path.exists(kept):
        cache = events_cache(tables, MESSAGES_FAILED)
        shutil.rmtree(tables.work_uri("sensors"), ignore_errors=True)
        for path in pa.table(tables.open(EVENTS).get_add_actions())["path"].to_pylist():
            note_events(tables, path, pq.read_table(os.path.join(tables.uri(EVENTS), path), schema=schemas.EVENTS))
        shutil.move(notes_file(cache), kept)


def _log_shape(tables: QueueTables, table: str) -> dict[str, Any]:
    """A log as an opener sees it: its version, files, and the commits after the last checkpoint."""
    log = os.path.join(tables.uri(table), "_delta_log")
    target = tables.open(table)
    checkpoint = None
    if os.path.exists(os.path.join(log, "_last_checkpoint")):
        with open(os.path.join(log, "_last_checkpoint")) as handle:
            checkpoint = json.load(handle)["version"]
    return {"version": target.version(), "files": len(target.file_uris()), "last_checkpoint": checkpoint,
            "commits_to_replay": target.version() - (checkpoint if checkpoint is not None else -1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10_000, help="enqueues (one file and commit each)")
    parser.add_argument("--failed", type=int, default=10_000,
                        help="rows in each of retry_1, poison, dead_letter and processed")
    parser.add_argument("--events", type=int, default=1_000, help="messages_failed events, one commit each")
    parser.add_argument("--rounds", type=int, default=5, help="steady-state rounds after the first evaluation")
    parser.add_argument("--new", type=int, default=10, help="real enqueues of 100 messages before each round")
    parser.add_argument("--reference", type=int, default=101,
                        help="real enqueues and event appends of the reference lake the seeded one is compared with")
    parser.add_argument("--through-enqueue", action="store_true",
                        help="seed through the product's enqueue and appends themselves (hours at full size)")
    parser.add_argument("--no-notes", action="store_true",
                        help="remove the enqueues' notes of their ids before the first evaluation (an older lake)")
    parser.add_argument("--quick", action="store_true", help="20,000 messages in 100 files (CI)")
    parser.add_argument("--workdir", default=None, help="keep the seeded lake here; a kept lake is measured again")
    parser.add_argument("--evaluate", metavar="WORKDIR", help=argparse.SUPPRESS)  # one round, in its own process
    args = parser.parse_args()
    if args.evaluate:
        evaluate(args.evaluate)
        return 0
    if args.quick:
        args.messages, args.files, args.failed, args.events, args.rounds = 20_000, 100, 400, 40, 2
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    return emit(lambda folder: run(folder, args.messages, args.files, args.failed, args.events, args.rounds, args.new,
                                   args.reference, args.through_enqueue, args.no_notes),
                args.workdir, "sensors-scale-")


if __name__ == "__main__":
    sys.exit(main())
