"""One retry cycle of one waiting table: recover, select, deliver on Spark, stage, commit.

Operator actions a kill left half done are completed before anything is selected (a message an
interrupted redrive planned to move must not be delivered here too), by a completer the caller
gives: the engine knows none of the actions (`operations/cycle.py` gives the operator console's).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from poison_pipeline.broker.conversations import (
    UnfinishedCleanup,
    ended_conversations,
    retry_cleanups,
    unfinished_cleanups,
)
from poison_pipeline.broker.transmission import pending_count, transmit
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.policy import Ordering
from poison_pipeline.engine import local
from poison_pipeline.engine.batch import CycleSpec
from poison_pipeline.engine.dedup import (
    SMALL_BATCH,
    Duplicates,
    Ledger,
    find_duplicates,
    mark_duplicates,
)
from poison_pipeline.engine.delivery import CRASH, TIMEOUT
from poison_pipeline.engine.ended import mark_ended
from poison_pipeline.engine.ordering import (
    blocked_conversations,
    in_conversation_order,
    mark_blocked,
    sorted_in_conversation_order,
)
from poison_pipeline.engine.reading import read_files
from poison_pipeline.engine.recovery import finish_staged
from poison_pipeline.engine.staging import stage_on_spark
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import queue_state
from poison_pipeline.storage.faults import StorageFailure
from poison_pipeline.storage.files import files_dataset
from poison_pipeline.storage.inflight import culprits
from poison_pipeline.storage.intake import settle_intake
from poison_pipeline.storage.journal import JournalEntry, read_entry, remove_tree, write_entry
from poison_pipeline.storage.lease import Holder, LeaseGuard
from poison_pipeline.storage.tables import (
    ACTIONS,
    ATTEMPTS,
    CONVERSATIONS,
    EVENTS,
    JOURNAL,
    PLANS,
    PROCESSED,
    TRANSMISSION,
    QueueTables,
    TableStats,
)
from poison_pipeline.storage.writer import QueueWriter, queue_writer


@dataclass
class Completed:
    """The interrupted actions a holder completed, those it closed `abandoned` (killed before their
    plan: nothing moved), and those it left for the next holder, with why."""

    completed: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    left: dict[str, str] = field(default_factory=dict)


class ActionCompleter(Protocol):
    """Completes the operator actions of `writer`'s queue that a kill left half done, holding its
    lease (`writer`), before a cycle selects anything."""

    def __call__(self, declaration: Declaration, writer: QueueWriter, run_id: str) -> Completed: ...


@dataclass
class CycleReport:
    queue: str
    table: str
    seq: int = 0
    skipped: str | None = None
    counts: dict[str, float] = field(default_factory=dict)
    recovered: dict[str, float] | None = None
    duration_s: float = 0.0
    oldest_age_s: float | None = None
    worker_deaths: int = 0
    # Ended conversations whose clean-up hook still fails after this cycle retried it.
    cleanup_failures: list[UnfinishedCleanup] = field(default_factory=list)
    # Operator actions a kill left half done, completed before this cycle selected anything.
    interrupted: Completed = field(default_factory=Completed)


def _worker_died(error: Exception) -> bool:
    return isinstance(error, local.WorkerDied) or "Python worker exited unexpectedly" in str(error)


def _stage(deliver: Callable[[CycleSpec], None], spec: CycleSpec, inflight: str) -> int:
    """Deliver (a Spark job, or a small cycle's worker process) and write the staged results;
    returns how many workers died doing it.

    A handler that kills its Python worker fails the whole delivery. It is then run again
    carefully: each task marks the message it is delivering, so the next death names its message,
    which is charged one aborted attempt per death (outcome `crash`; `timeout`, a HandlerTimeout,
    when the watchdog killed a hung attempt: engine/watchdog.py) and never called more often than
    its attempts allow. Every other message is simply delivered again in the next run:
    nothing of a failed delivery was committed, and receivers are idempotent by message id.
    """
    deaths = 0
    crashed: dict[str, tuple[str, ...]] = {}
    careful = False
    while True:
        try:
            deliver(replace(spec, inflight=inflight if careful else None, crashed=dict(crashed)))
            return deaths
        except Exception as error:
            if not _worker_died(error):
                raise
            deaths += 1
            # Markers left by an earlier careful run that was itself killed name nobody now.
            found = culprits(inflight, spec.storage_options)
            if not careful:
                careful = True
                continue
            if not found:
                raise
            for culprit in found:
                how = TIMEOUT if culprit.timed_out else CRASH
                crashed[culprit.message_id] = (*crashed.get(culprit.message_id, ()), how)


_ID_COLUMNS = ["message_id", "batch_id", "enqueued_at"]


def _due_ids(tables: QueueTables, table: str, stats: TableStats) -> pa.Table:
    """The id columns of a small cycle's due messages, read on the driver from its due files."""
    root = tables.uri(table) + "/"
    paths = [uri.removeprefix(root) for uri in stats.due_files]
    due = files_dataset(tables.uri(table), tables.storage_options, paths, None, schemas.MESSAGE)
    return due.to_table(columns=_ID_COLUMNS)


def _due(spark: SparkSession, tables: QueueTables, stats: TableStats) -> DataFrame:
    """A big cycle's due messages, in Spark."""
    return read_files(spark, list(stats.due_files), schemas.MESSAGE, tables.storage_options, sizes=stats.due_sizes)


# A session, or what builds one: a small cycle never needs Spark, so a run that only has small
# cycles to do never starts a JVM (or opens a Connect session).
SessionSource = SparkSession | Callable[[], SparkSession]


def _session(spark: SessionSource) -> SparkSession:
    return spark if hasattr(spark, "read") else spark()  # type: ignore[operator]


def run_cycle(
    spark: SessionSource,
    declaration: Declaration,
    queue: str,
    table: str,
    now: datetime | None = None,
    run_id: str = "manual",
    on_wait: Callable[[Holder], None] | None = None,
    *,
    complete_actions: ActionCompleter,
) -> CycleReport:
    """Process the due messages of `table` in `queue` once; safe to re-run after any crash.

    Holds the queue's lease throughout: a second starter of any work on this queue waits, then
    fails naming this run (`on_wait` hears of a holder this run waits for). `complete_actions`
    completes the queue's interrupted operator actions first."""
    tables = QueueTables.of(declaration, queue)
    if table not in tables.waiting:
        raise ValueError(f"{table!r} is not a waiting table of {queue!r}: {', '.join(tables.waiting)}")
    try:
        tables.ensure()
        with queue_writer(tables, f"{table} cycle", run_id, on_wait) as writer:
            report = _run_held(spark, declaration, writer, table, now, run_id, complete_actions)
            report.cleanup_failures = unfinished_cleanups(declaration, tables)
            return report
    except StorageFailure as failure:
        raise failure.meaning(
            f"The {table} cycle of queue {queue!r} stopped there and nothing is lost: every message is still where "
            "it was or where the commits made so far put it, and the next run of this cycle, once the storage "
            "accepts writes, completes it as after a crash (nothing committed twice)") from failure.__cause__


def _run_held(spark: SessionSource, declaration: Declaration, writer: QueueWriter, table: str,
              now: datetime | None, run_id: str, complete_actions: ActionCompleter) -> CycleReport:
    started = time.perf_counter()
    tables, lease = writer.tables, writer.lease
    queue = tables.queue
    queue_decl = declaration.queue(queue)
    report = CycleReport(queue, table)
    # What every cycle reads first, loaded at once.
    writer.prefetch([JOURNAL, table, EVENTS, ACTIONS, PLANS])
    previous = read_entry(tables, table, snapshot=writer.latest_if_exists(JOURNAL))
    seq = 1
    if previous is not None:
        seq = previous.seq if previous.state == "planned" else previous.seq + 1
        if previous.state == "staged":
            writer.check()
            report.recovered = finish_staged(declaration, writer, previous, fresh=False)
        elif previous.state == "planned":
            remove_tree(previous.staging, tables.storage_options)  # a compute that died: nothing of it was committed
    writer.check()
    report.interrupted = complete_actions(declaration, writer, run_id)
    settle_intake(writer)
    state = queue_state(tables, snapshot=writer.latest_if_exists(EVENTS))
    if not state.enabled:
        report.skipped = f"queue {queue!r} is disabled: {state.reason}"
        return report
    now = now or datetime.now(UTC)
    retry_cleanups(declaration, writer, now)
    stats = tables.stats(table, now, snapshot=writer.latest(table))
    if stats.oldest is not None:
        report.oldest_age_s = (now - stats.oldest).total_seconds()
    if not stats.due_files:
        report.skipped = "no message is due"
        report.duration_s = time.perf_counter() - started
        return report
    # What a cycle with due messages reads and commits to, loaded at once.
    writer.prefetch([PROCESSED, ATTEMPTS, CONVERSATIONS, TRANSMISSION])
    # A small cycle is delivered beside the driver, without a Spark job (engine/local.py).
    local_delivery = stats.due_rows <= declaration.small_cycles.max_messages
    if local_delivery:
        local.warm()  # the worker's fork server starts (once per process) while dedup runs
    # Per holder: a holder that lost its lease and still computes never writes where the next one stages.
    entry = JournalEntry(seq, "planned", table, run_id, now.isoformat(), list(stats.due_batches),
                         tables.work_uri("staging", table, f"{seq}-{lease.holder_id}"))
    write_entry(writer, entry)
    ordered = queue_decl.policy.ordering is Ordering.CONVERSATION
    window_start = (now - queue_decl.policy.dedup_window).date().isoformat()
    ledger = Ledger.within(tables, window_start, snapshot=writer.latest(PROCESSED))
    # A small cycle screens its messages with sets in its spec, found on the driver; a big one with
    # columns joined in Spark, so that nothing per message is collected on the driver.
    small = local_delivery or stats.due_rows <= SMALL_BATCH
    batch: DataFrame | None = None
    # What the big path caches for its delivery job, released once that job is done: a session
    # serves many cycles (a Connect server, the warm launcher), and each would otherwise keep its own.
    held = contextlib.ExitStack()
    # Delivered beside the driver, the rows are read once, for dedup and delivery: each due file
    # costs an open, and a queue fed by small enqueues has hundreds.
    rows = local.read_due(stats.due_files, tables.storage_options) if local_delivery else None
    if small:
        duplicates = find_duplicates(rows.select(_ID_COLUMNS) if rows is not None else _due_ids(tables, table, stats),
                                     ledger)
    else:
        duplicates = Duplicates(frozenset(), frozenset())
        session = _session(spark)
        batch = _due(session, tables, stats)
        batch = mark_ended(session, mark_duplicates(session, batch, ledger, held), tables)
        if ordered:
            batch = mark_blocked(session, batch, tables, table)
    spec = CycleSpec(
        queue=queue,
        table=table,
        policy=queue_decl.policy,
        poison=queue_decl.poison_queue,
        handler=queue_decl.poison_queue.handler if table == "poison" else queue_decl.handler,
        now=now,
        # Short: Delta truncates string statistics at 64 characters and batches are found by them.
        out_batch=f"{table}-{seq}-{run_id[:8]}",
        seen=duplicates.seen,
        losers=duplicates.losers,
        ended=frozenset(ended_conversations(tables, snapshot=writer.latest_if_exists(CONVERSATIONS)))
        if small else frozenset(),
        blocked=blocked_conversations(tables, table, list(stats.due_batches)) if ordered and small else {},
        guard=LeaseGuard.of(lease),
        storage_options=tables.storage_options,
    )
    if rows is not None:
        rows = sorted_in_conversation_order(rows) if ordered else rows
        deliver = functools.partial(local.stage, rows, staging=entry.staging)
    else:
        if batch is None:
            batch = _due(_session(spark), tables, stats)
        deliver = functools.partial(stage_on_spark, in_conversation_order(batch) if ordered else batch,
                                    staging=entry.staging, null_columns=stats.null_columns)
    with held:
        report.worker_deaths = _stage(deliver, spec, tables.work_uri("inflight", table, lease.holder_id))
    writer.check()
    entry.state = "staged"
    write_entry(writer, entry)
    report.seq = seq
    report.counts = finish_staged(declaration, writer, entry, fresh=True)
    if pending_count(tables, snapshot=writer.latest_if_exists(TRANSMISSION)):
        # What this cycle's handlers sent is offered to its targets in the same run.
        writer.check()
        sent = transmit(declaration, queue, now, run_id)
        report.counts.update({"transmitted": sum(sent.delivered.values()), "conversation_errors": len(sent.failures),
                              "unsent": sent.unsent})
    report.duration_s = time.perf_counter() - started
    return report
