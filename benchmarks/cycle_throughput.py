"""Throughput of an inbound retry cycle against the fastest honest plain Spark pass over the same messages.

    .venv/bin/python benchmarks/cycle_throughput.py [--messages N | --quick] [--poison-rate P]
                                                    [--master URL] [--appends K] [--phases] [--workdir DIR]

Writes N messages (200-byte JSON bodies, P poison, 0.5% transient) to a fresh inbound Delta table,
and N more without poison to each of two other queues, then times, in one Spark session:

- plain: read the first table's files, convert them column by column, call the same handler once
  per message (one retry), write id/ok/attempts/error: the floor;
- cycle: `run_cycle(..., "inbound")` on the first table: selection, dedup, delivery, staging and
  the Delta commits;
- clean cycle: the same on a table without poison;
- limit: the same handler over the same ids and bodies, already in memory, in plain Python
  processes forked one per core (bench_handler.limit_slice): the machine's limit for this work.

In the order limit, plain, clean cycle, cycle, clean cycle, plain, limit: each ratio compares the
cycle with the mean of what ran before and after it, so that the order favours neither side.

Prints one JSON line on stdout (the ratios cycle/plain and cycle/clean cycle against their targets);
everything else (Spark's logs included) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from fractions import Fraction
from math import floor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

HERE = Path(__file__).resolve().parent
# Spark's Python workers inherit PYTHONPATH from the JVM, which inherits it from this process: it
# has to be set before the session starts for the workers to import the benchmark's handler.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, str(HERE))

import bench_handler  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.pandas.types import from_arrow_schema  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.engine import commit as commit_module  # noqa: E402
from poison_pipeline.engine import cycle as cycle_module  # noqa: E402
from poison_pipeline.engine import recovery as recovery_module  # noqa: E402
from poison_pipeline.engine.batch import CycleSpec, Processor  # noqa: E402
from poison_pipeline.engine.cycle import CycleReport  # noqa: E402
from poison_pipeline.engine.dedup import SMALL_BATCH  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.tables import QueueTables  # noqa: E402
from poison_pipeline.storage.writer import LeaseFreeAppender, QueueWriter  # noqa: E402

BODY_BYTES = 200
POISON_RATE = 0.01
# The cycle at most 1.2x the plain pass and 3x the machine's limit, and poison costing at most 10%
# more than none (the same cycle over as many messages without poison).
TARGET_RATIO = 1.2
LIMIT_TARGET_RATIO = 3.0
POISON_TARGET_RATIO = 1.1
QUICK_MESSAGES = 50_000
# The queues the cycles without poison run on, before and after the cycle with poison: same size,
# same transient messages.
CLEAN_QUEUES = ("clean", "clean_after")
# Warm-up size: large enough for the JVM to compile the hot parquet/Arrow paths (with a few
# thousand rows the first timed pass still ran twice as slow as later ones), capped to stay cheap.
# At least one more than the largest cycle whose dedup runs on the driver: the warm-up then takes
# the path the timed cycles take (Spark jobs), so the first timed cycle is not charged with
# compiling it. With 50,001 the first timed 1M cycle still ran about 9% slower than the next one
# (its dedup job 2.1 s against 1.2 s): a quarter of the timed size, up to WARMUP_MAX, closes that.
WARMUP_MESSAGES = SMALL_BATCH + 1
WARMUP_MAX = 250_000


def warmup_size(messages: int) -> int:
    return min(messages, max(WARMUP_MESSAGES, min(messages // 4, WARMUP_MAX)))
BATCH_ID = "enq-benchmark"
# One retry inside the cycle lets a transient message succeed; a poison one fails both attempts and
# moves to retry_1. Delay 0 keeps nothing waiting on the clock.
POLICY = {
    "receive_retry_count": 1,
    "max_retry_cycles": 1,
    "retry_cycle_delay": 0,
    "receive_error_handling": "move",
}


@functools.cache
def _exact(rate: float) -> Fraction:
    # Exact, so that 1% makes every 100th message poison, not one drifting by rounding.
    return Fraction(str(rate))


def kind_of(index: int, poison_rate: float = POISON_RATE) -> str:
    """Message `index`'s kind: poison at an even spacing of `poison_rate` (every 100th, message 0
    first, at 1%), else transient when index % 200 == 1 (0.5%), else ok."""
    rate = _exact(poison_rate)
    if rate and floor(index * rate) != floor((index - 1) * rate):
        return "poison"
    if index % 200 == 1:
        return "transient"
    return "ok"


def body_of(index: int, poison_rate: float = POISON_RATE) -> bytes:
    head = f'{{"order_id":"m-{index:09d}","kind":"{kind_of(index, poison_rate)}","quantity":{index % 97 + 1},"note":"'
    # The padding makes every body exactly BODY_BYTES long whatever its kind.
    return (head + "x" * (BODY_BYTES - len(head) - 2) + '"}').encode()


def message_table(count: int, now: datetime, prefix: str, poison_rate: float = POISON_RATE) -> pa.Table:
    """`count` waiting messages of schemas.MESSAGE, built column-wise: fresh counts, due now."""
    bodies = pa.array([body_of(i, poison_rate) for i in range(count)], pa.binary())
    if count and not pc.all(pc.equal(pc.binary_length(bodies), BODY_BYTES)).as_py():
        raise AssertionError(f"every body must be {BODY_BYTES} bytes")
    ids = pa.array([f"{prefix}-{i:09d}" for i in range(count)], pa.string())
    no_headers = pa.MapArray.from_arrays(
        pa.array([0] * (count + 1), pa.int32()), pa.array([], pa.string()), pa.array([], pa.string())
    )
    columns: dict[str, pa.Array] = {
        "message_id": ids,
        "message_type": pa.array(["bench.order"] * count, pa.string()),
        "body": bodies,
        "encoding": pa.array(["json"] * count, pa.string()),
        "enqueued_at": pa.array([now] * count, schemas.TS),
        "headers": no_headers,
        "abort_count": pa.array([0] * count, pa.int32()),
        "total_abort_count": pa.array([0] * count, pa.int32()),
        "move_count": pa.array([0] * count, pa.int32()),
        "due_at": pa.array([now] * count, schemas.TS),
        "entered_at": pa.array([now] * count, schemas.TS),
        "batch_id": pa.array([BATCH_ID] * count, pa.string()),
    }
    return pa.Table.from_arrays(
        [columns.get(f.name, pa.nulls(count, f.type)) for f in schemas.MESSAGE], schema=schemas.MESSAGE
    )


def seed(declaration: Declaration, queue: str, count: int, now: datetime, appends: int = 1,
         poison_rate: float = POISON_RATE) -> list[str]:
    """Write the inbound table in `appends` commits of one batch; return its parquet files, which the
    plain pass reads too.

    The engine's appends write 65,536-row row groups, so Spark splits even one append over every
    core; more appends mean more files, as several enqueues would make.
    """
    return write_inbound(declaration, queue, message_table(count, now, queue, poison_rate), appends)


def write_inbound(declaration: Declaration, queue: str, messages: pa.Table, appends: int = 1) -> list[str]:
    """Append `messages` to the inbound table of `queue` in `appends` commits; return its files."""
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    size = -(-messages.num_rows // appends)
    appender = LeaseFreeAppender(tables)  # as enqueues append: without the queue's lease
    for start in range(0, messages.num_rows, size):
        appender.append("inbound", messages.slice(start, size))
    return tables.open("inbound").file_uris()


def plain_pass(spark: SparkSession, files: list[str], out: str, null_columns: tuple[str, ...] = ()) -> None:
    """Read, handle, write: the job the cycle is measured against. `null_columns`: envelope columns
    the Delta log shows null in every file, which it leaves unread as the engine's delivery job does."""
    # Only the envelope is read: a hand-written job has no counts or errors to carry through.
    frame = spark.read.parquet(*files).select(*(c for c in bench_handler.ENVELOPE_COLUMNS if c not in null_columns))
    results = frame.mapInArrow(bench_handler.plain_pass, from_arrow_schema(bench_handler.PLAIN_RESULT))
    results.write.mode("overwrite").parquet(out)


def plain_counts(spark: SparkSession, out: str) -> dict[str, int]:
    """Read back what the plain pass wrote (untimed), to show it did the same work as the cycle."""
    row = spark.read.parquet(out).agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.col("ok").cast("int")).alias("ok"),
        F.sum("attempts").alias("attempts"),
    ).first()
    assert row is not None
    return {"messages": row["messages"], "ok": row["ok"], "failed": row["messages"] - row["ok"],
            "attempts": row["attempts"]}


def limit_pass(messages: int, poison_rate: float, now: datetime, cores: int) -> tuple[float, tuple[int, int]]:
    """The handler over `messages` bodies built before the clock starts, split between `cores`
    processes forked when it starts (they inherit the bodies: nothing is copied or read). The
    seconds from the first fork to the last result, and (ok, failed)."""
    ids = [f"{bench_handler.QUEUE}-{i:09d}" for i in range(messages)]
    bodies = [body_of(i, poison_rate) for i in range(messages)]
    bounds = [messages * k // cores for k in range(cores + 1)]
    start = time.perf_counter()
    readers = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        read, write = os.pipe()
        if os.fork() == 0:  # the child: its slice, its counts on the pipe, and out without clean-up
            os.close(read)
            os.write(write, json.dumps(bench_handler.limit_slice(ids[a:b], bodies[a:b], now)).encode())
            os._exit(0)
        os.close(write)
        readers.append(read)
    counts = []
    for read in readers:
        with os.fdopen(read) as pipe:
            counts.append(json.loads(pipe.read()))
    for _ in readers:
        os.wait()
    seconds = time.perf_counter() - start
    return seconds, (sum(c[0] for c in counts), sum(c[1] for c in counts))


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


# --- CPU time ----------------------------------------------------------------------------------------


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process and every process under it: the JVM (Spark and its
    tasks), Spark's Python workers and, in this process, delta-rs. A process's reaped children count
    through its cutime/cstime. Other work on the machine stretches wall time much more than this.
    Linux only (/proc)."""
    children: dict[int, list[int]] = defaultdict(list)
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                text = stat.read()
        except OSError:
            continue  # it ended meanwhile
        # After "pid (comm) ": state ppid ... utime stime cutime cstime are fields 0, 1 and 11 to 14.
        fields = text[text.rindex(")") + 2:].split()
        children[int(fields[1])].append(int(entry.name))
        ticks[int(entry.name)] = sum(int(v) for v in fields[11:15])
    total, stack = 0, [os.getpid()]
    while stack:
        pid = stack.pop()
        total += ticks.get(pid, 0)
        stack.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def measured(action: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, CPU seconds of the process tree, and the result of `action()`."""
    cpu = tree_cpu_seconds()
    wall, result = timed(action)
    return wall, tree_cpu_seconds() - cpu, result


# --- optional phase timings of run_cycle (--phases) -------------------------------------------------


@contextlib.contextmanager
def phase_clock(extra: Iterable[tuple[Any, str, str]] = ()) -> Iterator[dict[str, float]]:
    """Time the phases of run_cycle by wrapping what it calls; restores everything afterwards.

    `extra` names more functions to time, as (owner, attribute name, label). Each label gets its wall
    seconds and, under "<label> [CPU s]", the CPU seconds of the process tree (`tree_cpu_seconds`).
    """
    spent: dict[str, float] = defaultdict(float)
    patches: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, label: Callable[..., str]) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def clocked(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), tree_cpu_seconds()
            try:
                return original(*args, **kwargs)
            finally:
                name = label(*args, **kwargs)
                spent[name] += time.perf_counter() - started
                spent[f"{name} [CPU s]"] += tree_cpu_seconds() - cpu

        patches.append((owner, name, original))
        setattr(owner, name, clocked)

    wrap(QueueTables, "stats", lambda *a, **k: "select: delta log stats")
    wrap(cycle_module, "find_duplicates", lambda *a, **k: "dedup: on the driver (pyarrow)")
    # A big cycle's marks are joins run by the staging job; what is timed here is their eager part
    # (the ledger files with a hash hit, the ended conversations).
    wrap(cycle_module, "mark_duplicates", lambda *a, **k: "dedup: Spark marks (eager part)")
    wrap(cycle_module, "mark_ended", lambda *a, **k: "ended conversations: Spark marks (eager part)")
    wrap(cycle_module, "stage_on_spark",
         lambda *a, **k: "deliver+stage: spark job (read, Processor, write staging)")
    wrap(recovery_module, "apply_staged", lambda *a, **k: "commit: apply_staged total")
    wrap(commit_module, "_attempt_rows", lambda *a, **k: "commit: build attempt rows (arrow)")
    wrap(QueueWriter, "append", lambda self, table, *a, **k: f"commit: delta append {table}")
    wrap(QueueWriter, "remove_batches", lambda self, table, *a, **k: f"commit: delta delete {table}")
    for owner, name, text in extra:
        wrap(owner, name, lambda *a, _text=text, **k: _text)
    try:
        yield spent
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


def accounted_seconds(spent: dict[str, float]) -> float:
    """The wall seconds of a phase table, each counted once (commit's parts are inside its total)."""
    return sum(v for k, v in spent.items()
               if (not k.startswith("commit: ") or "total" in k) and not k.endswith("[CPU s]"))


def _rows_out(function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
              batches: list[pa.RecordBatch]) -> int:
    return sum(out.num_rows for out in function(iter(batches)))


def python_per_row(declaration: Declaration, queue: str, now: datetime, rows: int) -> dict[str, float]:
    """Microseconds per message of the executor-side Python of each pass, measured in-process: the
    Spark jobs are Python-bound, so this is what sets their pace. Each pass gets the columns it
    reads in Spark (the cycle all of them, the plain pass the envelope)."""
    sample = message_table(rows, now, "sample")
    queue_decl = declaration.queue(queue)
    spec = CycleSpec(queue, "inbound", queue_decl.policy, queue_decl.poison_queue, queue_decl.handler,
                     now, "inbound-1-bench", storage_options=dict(declaration.storage_options))
    passes: dict[str, tuple[Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], pa.Table]] = {
        "processor": (Processor(spec), sample),
        "plain": (bench_handler.plain_pass, sample.select(bench_handler.ENVELOPE_COLUMNS)),
    }
    spent: dict[str, float] = {}
    for name, (function, data) in passes.items():
        batches = data.to_batches(max_chunksize=10_000)
        seconds, _ = timed(functools.partial(_rows_out, function, batches))
        spent[f"{name}_us_per_msg"] = round(seconds / rows * 1e6, 2)
    return spent


# --- the run ------------------------------------------------------------------------------------------


def timed_cycle(spark: SparkSession, declaration: Declaration, queue: str, now: datetime,
                phases: bool) -> tuple[tuple[float, float], CycleReport, dict[str, float] | None]:
    """One inbound cycle of `queue`: its wall and CPU seconds, report, and phases when asked."""
    with phase_clock() if phases else contextlib.nullcontext(None) as spent:
        seconds, cpu, report = measured(
            lambda: run_cycle(spark, declaration, queue, "inbound", now=now, run_id="bench"))
    assert isinstance(report, CycleReport)
    if report.skipped:
        raise RuntimeError(f"the cycle of {queue} did nothing: {report.skipped}")
    if spent is None:
        return (seconds, cpu), report, None
    accounted = accounted_seconds(spent)
    table = {k: round(v, 2) for k, v in sorted(spent.items())}
    table["other (journal, queue state, ...)"] = round(seconds - accounted, 2)
    return (seconds, cpu), report, table


def ratio(value: float, floor_value: float, target: float) -> dict[str, Any]:
    return {"ratio": round(value / floor_value, 3), "target": target, "within_target": value / floor_value <= target}


def run(messages: int, master: str, workdir: str, appends: int, phases: bool, poison_rate: float) -> dict[str, Any]:
    load_start = os.getloadavg()
    lake = os.path.join(workdir, "lake")
    declaration = parse_declaration(
        {
            "lake_root": lake,
            "queues": {
                name: {"handler": bench_handler.HANDLER, "policy": POLICY}
                for name in (bench_handler.QUEUE, *CLEAN_QUEUES, "warmup")
            },
        }
    )
    now = datetime.now(UTC)
    generation, files = timed(lambda: seed(declaration, bench_handler.QUEUE, messages, now, appends, poison_rate))
    for clean in CLEAN_QUEUES:
        seed(declaration, clean, messages, now, appends, 0.0)
    warm_files = seed(declaration, "warmup", warmup_size(messages), now, 1, poison_rate)
    print(f"seeded {messages} messages in {len(files)} file(s) in {generation:.1f}s", file=sys.stderr)
    # Read from the log before any cycle consumes the table (10 ms; the second plain pass reads the
    # same files after the cycle has emptied it).
    nulls = QueueTables.of(declaration, bench_handler.QUEUE).stats("inbound", now).null_columns
    warm_nulls = QueueTables.of(declaration, "warmup").stats("inbound", now).null_columns

    # The console progress bar would interleave with the log on stderr; it measures nothing.
    settings = SparkSettings(master=master, app_name="cycle_throughput",
                             config={"spark.ui.showConsoleProgress": "false"})
    spark = build_session(settings)
    spark.sparkContext.setLogLevel("ERROR")
    cores = spark.sparkContext.defaultParallelism
    try:
        # Both passes once on a separate queue: starts the Python workers and warms the JVM's
        # parquet, Arrow and shuffle code and delta-rs, so neither timed pass is charged with it.
        plain_pass(spark, warm_files, os.path.join(workdir, "plain-warmup"), warm_nulls)
        run_cycle(spark, declaration, "warmup", "inbound", now=now, run_id="warmup")

        # The plain pass runs before and after the cycles, and a clean cycle before and after the
        # cycle with poison (a cycle consumes its input: each queue is cycled once): the means
        # cancel whatever the order still favours.
        limit_before, limit_counts = limit_pass(messages, poison_rate, now, cores)
        plain_before, plain_cpu_before, _ = measured(
            lambda: plain_pass(spark, files, os.path.join(workdir, "plain-1"), nulls))
        (clean_before, clean_cpu_before), clean_report, clean_phases = timed_cycle(
            spark, declaration, CLEAN_QUEUES[0], now, phases)
        (cycle_seconds, cycle_cpu), report, poison_phases = timed_cycle(
            spark, declaration, bench_handler.QUEUE, now, phases)
        (clean_after, clean_cpu_after), _, _ = timed_cycle(spark, declaration, CLEAN_QUEUES[1], now, False)
        plain_after, plain_cpu_after, _ = measured(
            lambda: plain_pass(spark, files, os.path.join(workdir, "plain-2"), nulls))
        plain = plain_counts(spark, os.path.join(workdir, "plain-2"))
        limit_after, _ = limit_pass(messages, poison_rate, now, cores)
    finally:
        spark.stop()

    plain_seconds = (plain_before + plain_after) / 2
    plain_cpu = (plain_cpu_before + plain_cpu_after) / 2
    clean_seconds = (clean_before + clean_after) / 2
    clean_cpu = (clean_cpu_before + clean_cpu_after) / 2
    limit_seconds = (limit_before + limit_after) / 2
    ratios = {
        "cycle_over_plain": ratio(cycle_seconds, plain_seconds, TARGET_RATIO),
        "cycle_over_limit": ratio(cycle_seconds, limit_seconds, LIMIT_TARGET_RATIO),
        "poison_over_clean": ratio(cycle_seconds, clean_seconds, POISON_TARGET_RATIO),
    }
    result: dict[str, Any] = {
        "benchmark": "cycle_throughput",
        "messages": messages,
        "poison_rate": poison_rate,
        "body_bytes": BODY_BYTES,
        "master": master,
        "cycle_seconds": round(cycle_seconds, 2),
        "clean_cycle_seconds": round(clean_seconds, 2),
        "plain_seconds": round(plain_seconds, 2),
        "plain_runs_seconds": [round(plain_before, 2), round(plain_after, 2)],
        "limit_seconds": round(limit_seconds, 2),
        "limit_runs_seconds": [round(limit_before, 2), round(limit_after, 2)],
        "limit_msgs_per_s": round(messages / limit_seconds),
        "limit_counts": {"ok": limit_counts[0], "failed": limit_counts[1]},
        "limit_processes": cores,
        "clean_cycle_runs_seconds": [round(clean_before, 2), round(clean_after, 2)],
        "cycle_msgs_per_s": round(messages / cycle_seconds),
        "clean_cycle_msgs_per_s": round(messages / clean_seconds),
        "plain_msgs_per_s": round(messages / plain_seconds),
        **ratios,
        "within_target": all(r["within_target"] for r in ratios.values()),
        # CPU seconds of the whole process tree (driver, JVM, Python workers): steadier than wall
        # time when other work shares the machine, but blind to a core left idle. Not the target.
        "cpu_seconds": {"cycle": round(cycle_cpu, 1), "clean_cycle": round(clean_cpu, 1),
                        "plain": round(plain_cpu, 1)},
        "cpu_ratios": {"cycle_over_plain": round(cycle_cpu / plain_cpu, 3),
                       "poison_over_clean": round(cycle_cpu / clean_cpu, 3)},
        "cycle_counts": {k: int(v) for k, v in report.counts.items()},
        "clean_cycle_counts": {k: int(v) for k, v in clean_report.counts.items()},
        "plain_counts": plain,
        "appends": appends,
        "input_files": len(files),
        "warmup_messages": warmup_size(messages),
        "spark_cores": cores,
    }
    if phases:
        result["cycle_phases_s"] = poison_phases
        result["clean_cycle_phases_s"] = clean_phases
        result["python_per_row"] = python_per_row(declaration, bench_handler.QUEUE, now, 50_000)
    result["load_avg"] = {"start": load_start, "end": os.getloadavg()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_MESSAGES:,} messages (CI: checks that it runs, says nothing of speed)")
    parser.add_argument("--poison-rate", type=float, default=POISON_RATE,
                        help="share of poison messages in the cycle with poison (default 0.01)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--appends", type=int, default=1,
                        help="write the inbound batch in this many commits (files), "
                        "as several enqueues would (default 1)")
    parser.add_argument("--workdir", default=None,
                        help="where the lake and outputs go (default: a temporary folder, removed after)")
    parser.add_argument("--phases", action="store_true",
                        help="also time the phases of the cycles and the per-message Python of each pass")
    args = parser.parse_args(argv)
    messages = QUICK_MESSAGES if args.quick else args.messages
    if messages < 1 or not 1 <= args.appends <= messages:
        parser.error("--messages must be at least 1, and --appends between 1 and --messages")
    if not 0 <= args.poison_rate <= 1:
        parser.error(f"--poison-rate must be between 0 and 1, got {args.poison_rate}")

    return emit(lambda workdir: run(messages, args.master, workdir, args.appends, args.phases, args.poison_rate),
                args.workdir, "cycle_throughput-")


def emit(compute: Callable[[str], dict[str, Any]], workdir: str | None, prefix: str) -> int:
    """Run `compute` in `workdir` (default: a temporary folder, removed after) and print its result
    as the one JSON line on stdout."""
    # The JVM and the libraries write to file descriptor 1 too: point it at stderr for the whole run
    # so stdout carries the JSON line and nothing else.
    stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    folder = workdir or tempfile.mkdtemp(prefix=prefix)
    try:
        result = compute(folder)
    finally:
        if workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    stdout.write(json.dumps(result) + "\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
