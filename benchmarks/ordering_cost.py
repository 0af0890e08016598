"""Cost of `ordering: conversation`: one inbound cycle against the same cycle with `ordering: none`.

    .venv/bin/python benchmarks/ordering_cost.py [--messages N] [--conversations C] [--master URL]
                                                 [--appends K] [--rounds R] [--all-ok]
                                                 [--random-padding] [--phases] [--workdir DIR]

Writes N messages in C conversations (N / C each, sequence numbers 1..N/C, rows in shuffled order;
200-byte JSON bodies, 1% poison, 0.5% transient, spread at random over the conversations) to the
inbound Delta tables of fresh queues that differ only in `ordering`, then times one
`run_cycle(..., "inbound")` of each in one Spark session: `none` then `conversation`, and in a second
round `conversation` then `none` on fresh copies.

Prints one JSON line on stdout; everything else (Spark's logs included) goes to stderr.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import os
import random
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Importing cycle_throughput also puts this folder on PYTHONPATH for Spark's Python workers, which
# import the handler (bench_handler) by name; it must happen before the session starts.
import bench_handler  # noqa: E402
import cycle_throughput as ct  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.pandas.types import from_arrow_schema  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine import cycle as cycle_module  # noqa: E402
from poison_pipeline.engine import recovery as recovery_module  # noqa: E402
from poison_pipeline.engine.batch import CycleSpec, Processor  # noqa: E402
from poison_pipeline.engine.cycle import CycleReport  # noqa: E402
from poison_pipeline.engine.ordering import in_conversation_order  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables  # noqa: E402

TARGET_RATIO = 1.5
MODES = ("none", "conversation")
# The same layout every run: which message is poison, and where it sits in its conversation.
LAYOUT_SEED = 20261121
# The counts a run is checked against (the rest of CycleReport.counts is reported as is).
CHECKED = ("messages", "processed", "moved", "attempts")
# Also time these inside run_cycle (--phases), besides what cycle_throughput.phase_clock times.
EXTRA_PHASES = [
    (cycle_module, "blocked_conversations", "select: blocked conversations (delta-rs, ordered only)"),
    (recovery_module, "end_failed_conversations", "conversations: end failed ones (staged read)"),
]
STAGING = "deliver+stage: spark job (read, Processor, write staging)"


# --- data -----------------------------------------------------------------------------------------------


def slots(messages: int, seed: int) -> list[int]:
    """slot[k]: where message k sits. Its conversation is slot // size, its sequence number
    slot % size + 1. Message k's kind is cycle_throughput.kind_of(k), so the shuffle spreads the
    poison and transient messages at random over conversations and positions."""
    order = list(range(messages))
    random.Random(seed).shuffle(order)
    return order


def conversation_table(messages: int, conversations: int, now: datetime, seed: int,
                       all_ok: bool = False, random_padding: bool = False) -> pa.Table:
    """cycle_throughput's message table with conversation ids and sequence numbers set. Rows stay
    in message order, which the slots make a random order of conversations and sequence numbers:
    every file, and every task of an unordered read, holds a share of every conversation."""
    size = messages // conversations
    where = slots(messages, seed)
    table = ct.message_table(messages, now, "msg")
    if all_ok or random_padding:
        # k + 2 is an `ok` index whenever k is not (poison: k % 100 == 0; transient: k % 200 == 1).
        bodies = [ct.body_of(k if not all_ok or ct.kind_of(k) == "ok" else k + 2) for k in range(messages)]
        if random_padding:
            bodies = _randomly_padded(bodies, seed)
        column = pa.array(bodies, pa.binary())
        table = table.set_column(table.schema.get_field_index("body"), schemas.MESSAGE.field("body"), column)
    conversation = pa.array([f"conv-{s // size:06d}" for s in where], pa.string())
    sequence = pa.array([s % size + 1 for s in where], pa.int64())
    for name, array in (("conversation_id", conversation), ("sequence_number", sequence)):
        table = table.set_column(table.schema.get_field_index(name), schemas.MESSAGE.field(name), array)
    return table


def _randomly_padded(bodies: list[bytes], seed: int) -> list[bytes]:
    """The same bodies with their run of `x` padding replaced by random base64 text of the same
    length: still 200 bytes of valid JSON, but no longer compressible to a few bytes."""
    noise = base64.b64encode(random.Random(seed).randbytes(len(bodies) * ct.BODY_BYTES))
    padded = []
    for i, body in enumerate(bodies):
        head = body[:-2].rstrip(b"x")
        width = len(body) - 2 - len(head)
        padded.append(head + noise[i * ct.BODY_BYTES:i * ct.BODY_BYTES + width] + body[-2:])
    return padded


def expected_counts(messages: int, conversations: int, seed: int, all_ok: bool = False) -> dict[str, dict[str, int]]:
    """What each mode's cycle must report. Without ordering every message is attempted. With it,
    the first poison message of a conversation fails twice and moves to retry_1, and every later
    message of the conversation is held: moved with it, never attempted."""
    if all_ok:
        clean = {"messages": messages, "processed": messages, "moved": 0, "attempts": messages,
                 "attempted_messages": messages, "held": 0}
        return {"none": clean, "conversation": {**clean, "conversations_with_poison": 0}}
    size = messages // conversations
    where = slots(messages, seed)
    kinds = [ct.kind_of(k) for k in range(messages)]
    poison = kinds.count("poison")
    transient = kinds.count("transient")
    first: dict[int, int] = {}
    for k, kind in enumerate(kinds):
        if kind == "poison":
            conversation, sequence = divmod(where[k], size)
            first[conversation] = min(first.get(conversation, size), sequence + 1)
    held = sum(size - f for f in first.values())
    # A transient message is attempted (and succeeds on its second attempt) unless it is held.
    transient_attempted = sum(
        1 for k, kind in enumerate(kinds)
        if kind == "transient" and where[k] % size + 1 < first.get(where[k] // size, size + 1)
    )
    attempted = messages - held
    return {
        "none": {"messages": messages, "processed": messages - poison, "moved": poison,
                 "attempts": messages + poison + transient, "attempted_messages": messages, "held": 0},
        "conversation": {"messages": messages, "processed": messages - len(first) - held,
                         "moved": len(first) + held, "attempts": attempted + len(first) + transient_attempted,
                         "attempted_messages": attempted, "held": held,
                         "conversations_with_poison": len(first)},
    }


def attempted_messages(declaration: Declaration, queue: str) -> int:
    """Distinct messages the cycle called the handler for, read back from the attempts ledger."""
    rows = QueueTables.of(declaration, queue).open(ATTEMPTS).to_pyarrow_dataset().to_table(columns=["message_id"])
    return pc.count_distinct(rows["message_id"]).as_py()


# --- optional measurements (--phases) -------------------------------------------------------------------


def _last_stage(spark: SparkSession) -> int:
    store = spark.sparkContext._jsc.sc().statusStore()
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # set while a SparkContext is running
    found = store.stageList(None, False, False, gateway.new_array(gateway.jvm.double, 0), None)
    return max((found.apply(i).stageId() for i in range(found.size())), default=-1)


def stages_since(spark: SparkSession, after: int) -> list[dict[str, Any]]:
    """The completed Spark stages with an id above `after`, from the driver's status store (the UI
    is off): wall time, tasks, summed task time, JVM CPU, shuffle. The Python workers' CPU is not
    in `jvm_cpu_s`: they are other processes."""
    store = spark.sparkContext._jsc.sc().statusStore()
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # set while a SparkContext is running
    found = store.stageList(None, False, False, gateway.new_array(gateway.jvm.double, 0), None)
    stages = []
    for i in range(found.size()):
        s = found.apply(i)
        if s.stageId() <= after or s.status().toString() != "COMPLETE":
            continue
        started, ended = s.submissionTime(), s.completionTime()
        wall = None
        if started.isDefined() and ended.isDefined():
            wall = (ended.get().getTime() - started.get().getTime()) / 1000
        stages.append({
            "stage": s.stageId(),
            "role": _role(s.name(), s.shuffleReadBytes(), s.shuffleWriteBytes()),
            "tasks": s.numTasks(),
            "wall_s": wall,
            "task_time_s": round(s.executorRunTime() / 1000, 2),
            "jvm_cpu_s": round(s.executorCpuTime() / 1e9, 2),
            "shuffle_write_s": round(s.shuffleWriteTime() / 1e9, 2),
            "shuffle_read_mb": round(s.shuffleReadBytes() / 2**20, 1),
            "shuffle_write_mb": round(s.shuffleWriteBytes() / 2**20, 1),
            "spill_mb": round((s.memoryBytesSpilled() + s.diskBytesSpilled()) / 2**20, 1),
        })
    return sorted(stages, key=lambda stage: stage["stage"])


def _role(name: str, shuffle_read: int, shuffle_write: int) -> str:
    # Adaptive execution submits the ordered cycle's stages from a thread pool, which names them
    # after a JDK frame: the shuffle, not the name, says which is which.
    if "dedup.py" in name:
        return "dedup"
    if shuffle_write:
        return "staging: read + shuffle write"
    if shuffle_read:
        return "staging: shuffle read + sort + Processor + write"
    return "staging: read + Processor + write"


def _noop_write(frame: DataFrame) -> None:
    frame.write.format("noop").mode("overwrite").save()


def ordering_only(spark: SparkSession, files: list[str]) -> dict[str, dict[str, float]]:
    """The JVM work conversation ordering adds, without the Python: the cycle's read of the files,
    alone, then with the repartition by conversation, then with the sort too (in_conversation_order),
    each into Spark's `noop` sink. Best of three runs, in wall and in CPU seconds."""
    batch = spark.read.schema(from_arrow_schema(schemas.MESSAGE)).parquet(*files)
    key = F.coalesce(F.col("conversation_id"), F.col("message_id"))
    frames: dict[str, DataFrame] = {
        "read": batch,
        "read + repartition by conversation": batch.repartition(key),
        "read + repartition + sort (in_conversation_order)": in_conversation_order(batch),
    }
    spent: dict[str, dict[str, float]] = {}
    for name, frame in frames.items():
        runs = [ct.measured(functools.partial(_noop_write, frame)) for _ in range(3)]
        spent[name] = {"wall_s": round(min(r[0] for r in runs), 2), "cpu_s": round(min(r[1] for r in runs), 2)}
    return spent


def python_per_row(declaration: Declaration, now: datetime, rows: int, size: int,
                   all_ok: bool = False, random_padding: bool = False) -> dict[str, float]:
    """CPU microseconds per message of the executor-side Python (Processor) of each mode, in-process
    on the same sample; the ordered one gets its rows sorted the way Spark hands them over."""
    sample = conversation_table(rows, max(1, rows // size), now, LAYOUT_SEED, all_ok, random_padding)
    spent: dict[str, float] = {}
    for mode in MODES:
        queue = f"warmup_{mode}"
        queue_decl = declaration.queue(queue)
        spec = CycleSpec(queue, "inbound", queue_decl.policy, queue_decl.poison_queue, queue_decl.handler,
                         now, "inbound-1-bench", storage_options=dict(declaration.storage_options))
        data = sample if mode == "none" else sample.sort_by(
            [("conversation_id", "ascending"), ("sequence_number", "ascending")])
        batches = data.to_batches(max_chunksize=10_000)
        runs = []
        for _ in range(3):
            started = time.process_time()
            sum(out.num_rows for out in Processor(spec)(iter(batches)))
            runs.append(time.process_time() - started)
        best = min(runs)
        spent[f"processor_{mode}_us_per_msg"] = round(best / rows * 1e6, 2)
    return spent


# --- the run --------------------------------------------------------------------------------------------


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run(messages: int, conversations: int, master: str, workdir: str, appends: int, rounds: int,
        phases: bool, all_ok: bool = False, random_padding: bool = False) -> dict[str, Any]:
    size = messages // conversations
    warm_messages = min(messages, ct.WARMUP_MESSAGES)
    # Round r runs `none` first when r is odd and `conversation` first when it is even.
    order = [(r, mode) for r in range(1, rounds + 1) for mode in (MODES if r % 2 else MODES[::-1])]
    queues = {f"{mode}_{r}": mode for r, mode in order} | {f"warmup_{mode}": mode for mode in MODES}
    declaration = parse_declaration(
        {
            "lake_root": os.path.join(workdir, "lake"),
            "queues": {
                name: {"handler": bench_handler.HANDLER, "policy": {**ct.POLICY, "ordering": mode}}
                for name, mode in queues.items()
            },
        }
    )
    now = datetime.now(UTC)
    seconds, data = ct.timed(
        lambda: conversation_table(messages, conversations, now, LAYOUT_SEED, all_ok, random_padding))
    files: dict[str, list[str]] = {}
    for r, mode in order:
        files[f"{mode}_{r}"] = ct.write_inbound(declaration, f"{mode}_{r}", data, appends)
    warm = conversation_table(warm_messages, max(1, warm_messages // size), now, LAYOUT_SEED, all_ok,
                              random_padding)
    for mode in MODES:
        ct.write_inbound(declaration, f"warmup_{mode}", warm, appends)
    del data, warm
    print(f"seeded {len(order)} queues of {messages} messages in {conversations} conversations "
          f"({len(files['none_1'])} file(s) each); built in {seconds:.1f}s", file=sys.stderr)
    expected = expected_counts(messages, conversations, LAYOUT_SEED, all_ok)

    settings = SparkSettings(master=master, app_name="ordering_cost",
                             config={"spark.ui.showConsoleProgress": "false"})
    spark = build_session(settings)
    spark.sparkContext.setLogLevel("ERROR")
    cores = spark.sparkContext.defaultParallelism
    runs: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    load_start = _load()
    try:
        # Both modes once on separate small queues: starts the Python workers and warms the JVM's
        # parquet, Arrow, shuffle and sort code and delta-rs, so no timed cycle is charged with it.
        for mode in MODES:
            run_cycle(spark, declaration, f"warmup_{mode}", "inbound", now=now, run_id="warmup")
        load_start = _load()
        for r, mode in order:
            queue = f"{mode}_{r}"
            before = _last_stage(spark) if phases else -1
            load = _load()
            with ct.phase_clock(EXTRA_PHASES) if phases else contextlib.nullcontext(None) as spent:
                seconds, cpu, report = ct.measured(
                    functools.partial(run_cycle, spark, declaration, queue, "inbound", now=now, run_id=queue))
            assert isinstance(report, CycleReport)
            if report.skipped:
                raise RuntimeError(f"the {queue} cycle did nothing: {report.skipped}")
            entry: dict[str, Any] = {"queue": queue, "mode": mode, "seconds": seconds, "cpu_seconds": cpu,
                                     "load_1m": load[0], "counts": {k: int(v) for k, v in report.counts.items()}}
            if phases:
                assert spent is not None
                entry["phases"] = dict(spent)
                entry["stages"] = stages_since(spark, before)
            runs.append(entry)
            print(f"{queue}: {seconds:.2f}s, {cpu:.1f} CPU s (load {load[0]}) {entry['counts']}", file=sys.stderr)
            for stage in entry.get("stages", []):
                print(f"  {stage}", file=sys.stderr)
        load_end = _load()
        if phases:
            extra["ordering_only_s"] = ordering_only(spark, files["none_1"])
    finally:
        spark.stop()

    for entry in runs:
        entry["counts"]["attempted_messages"] = attempted_messages(declaration, entry["queue"])
        entry["counts"]["held"] = entry["counts"]["messages"] - entry["counts"]["attempted_messages"]
    counts = {mode: next(e["counts"] for e in runs if e["mode"] == mode) for mode in MODES}
    as_expected = all(
        e["counts"].get(k, 0) == expected[e["mode"]][k] for e in runs for k in (*CHECKED, "attempted_messages")
    )
    seconds_of = {mode: [e["seconds"] for e in runs if e["mode"] == mode] for mode in MODES}
    cpu_of = {mode: [e["cpu_seconds"] for e in runs if e["mode"] == mode] for mode in MODES}
    none_s, conversation_s = _mean(seconds_of["none"]), _mean(seconds_of["conversation"])
    none_cpu, conversation_cpu = _mean(cpu_of["none"]), _mean(cpu_of["conversation"])
    result: dict[str, Any] = {
        "messages": messages,
        "conversations": conversations,
        "messages_per_conversation": size,
        "body_bytes": ct.BODY_BYTES,
        "all_ok": all_ok,
        "random_padding": random_padding,
        "master": master,
        "none_seconds": round(none_s, 2),
        "conversation_seconds": round(conversation_s, 2),
        "ratio": round(conversation_s / none_s, 2),
        "target_ratio": TARGET_RATIO,
        "within_target": conversation_s / none_s <= TARGET_RATIO,
        "run_order": [e["queue"] for e in runs],
        "none_runs_seconds": [round(s, 2) for s in seconds_of["none"]],
        "conversation_runs_seconds": [round(s, 2) for s in seconds_of["conversation"]],
        # The same comparison in CPU seconds of the whole process tree: steadier when other work
        # shares the cores, but blind to lost parallelism (a core left idle costs no CPU).
        "none_cpu_seconds": round(none_cpu, 1),
        "conversation_cpu_seconds": round(conversation_cpu, 1),
        "cpu_ratio": round(conversation_cpu / none_cpu, 2),
        "none_runs_cpu_seconds": [round(s, 1) for s in cpu_of["none"]],
        "conversation_runs_cpu_seconds": [round(s, 1) for s in cpu_of["conversation"]],
        "none_counts": counts["none"],
        "conversation_counts": counts["conversation"],
        "counts_as_expected": as_expected,
        "conversations_with_poison": expected["conversation"]["conversations_with_poison"],
        "none_msgs_per_s": round(messages / none_s),
        "conversation_msgs_per_s": round(messages / conversation_s),
        "conversation_attempted_msgs_per_s": round(counts["conversation"]["attempted_messages"] / conversation_s),
        "appends": appends,
        "input_files": len(files["none_1"]),
        "spark_cores": cores,
        "load_average": {"start": load_start, "end": load_end, "per_run_1m": [e["load_1m"] for e in runs]},
    }
    if not as_expected:
        result["expected_counts"] = expected
        print(f"counts differ from the expected {expected}", file=sys.stderr)
    if phases:
        result["cycle_phases_s"] = {mode: _mean_phases([e for e in runs if e["mode"] == mode]) for mode in MODES}
        result["staging_stages"] = {e["queue"]: e["stages"] for e in runs}
        result.update(extra)
        result["python_per_row"] = python_per_row(declaration, now, min(messages, 50_000), size, all_ok,
                                                  random_padding)
    return result


def _mean_phases(runs: list[dict[str, Any]]) -> dict[str, float]:
    """cycle_throughput's phase table, averaged over the runs of one mode."""
    totals: dict[str, float] = defaultdict(float)
    for entry in runs:
        spent = entry["phases"]
        accounted = ct.accounted_seconds(spent)
        for k, v in spent.items():
            totals[k] += v
        totals["other (journal, queue state, ...)"] += entry["seconds"] - accounted
    return {k: round(v / len(runs), 2) for k, v in sorted(totals.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--conversations", type=int, default=10_000,
                        help="conversations the messages are spread over; must divide --messages")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--appends", type=int, default=4,
                        help="write each inbound table in this many commits (files); default 4")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of one cycle per mode, on fresh copies; odd rounds run `none` "
                        "first, even ones `conversation` first (default 2)")
    parser.add_argument("--workdir", default=None,
                        help="where the lake goes (default: a temporary folder, removed after)")
    parser.add_argument("--all-ok", action="store_true",
                        help="no poison or transient message: nothing is held, which isolates the "
                        "cost of the repartition and sort")
    parser.add_argument("--random-padding", action="store_true",
                        help="pad the bodies with random text instead of `x`: the shuffle and the "
                        "staged files then carry incompressible bodies")
    parser.add_argument("--phases", action="store_true",
                        help="also time the phases of each cycle, its Spark stages, the ordering "
                        "alone (noop sink) and the per-message Python of each mode")
    args = parser.parse_args(argv)
    if args.messages < 1 or not 1 <= args.conversations <= args.messages or args.messages % args.conversations:
        parser.error("--conversations must be between 1 and --messages and divide it")
    if not 1 <= args.appends <= args.messages or args.rounds < 1:
        parser.error("--appends must be between 1 and --messages, and --rounds at least 1")

    return ct.emit(lambda workdir: run(args.messages, args.conversations, args.master, workdir, args.appends,
                                       args.rounds, args.phases, args.all_ok, args.random_padding),
                   args.workdir, "ordering_cost-")

if __name__ == "__main__":
    sys.exit(main())
