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
from typing import Protocol, cast

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
from poison_pipeline.domain.outage import probed
from poison_pipeline.domain.policy import Ordering
from poison_pipeline.domain.routing import INBOUND
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


class AfterCommit(Protocol):
    """Operator work that waits for what a cycle did (a ramp's next step), run holding the queue's
    lease (`writer`) once the cycle's commit landed."""

    def __call__(self, declaration: Declaration, writer: QueueWriter, run_id: str) -> None: ...


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
    # A probe of a queue disabled by an outage: how many messages it tried (0: not a probe).
    probe: int = 0


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
    # Not isinstance: a Spark Connect session is a class of its own.
    return cast(SparkSession, spark) if hasattr(spark, "read") else cast(Callable[[], SparkSession], spark)()


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
    after_commit: AfterCommit | None = None,
    probe: bool = False,
) -> CycleReport:
    """Process the due messages of `table` in `queue` once; safe to re-run after any crash.

    Holds the queue's lease throughout: a second starter of any work on this queue waits, then
    fails naming this run (`on_wait` hears of a holder this run waits for). `complete_actions`
    completes the queue's interrupted operator actions first. `probe`: a queue disabled by an
    outage whose policy says `outage_recovery: probe` tries its `probe.messages` oldest due
    messages, charged nothing, and resumes on a success (on any other queue, a cycle as usual).
    `after_commit` runs once the cycle's commit landed, still holding the lease."""
    tables = QueueTables.of(declaration, queue)
    if table not in tables.waiting:
        raise ValueError(f"{table!r} is not a waiting table of {queue!r}: {', '.join(tables.waiting)}")
    try:
        tables.ensure()
        with queue_writer(tables, f"{table} cycle", run_id, on_wait) as writer:
            report = _run_held(spark, declaration, writer, table, now, run_id, complete_actions, probe)
            if after_commit is not None and report.counts:
                after_commit(declaration, writer, run_id)
            report.cleanup_failures = unfinished_cleanups(declaration, tables)
            return report
    except StorageFailure as failure:
        raise failure.meaning(
            f"The {table} cycle of queue {queue!r} stopped there and nothing is lost: every message is still where "
            "it was or where the commits made so far put it, and the next run of this cycle, once the storage "
            "accepts writes, completes it as after a crash (nothing committed twice)") from failure.__cause__


def _run_held(spark: SessionSource, declaration: Declaration, writer: QueueWriter, table: str,
              now: datetime | None, run_id: str, complete_actions: ActionCompleter, probe: bool = False) -> CycleReport:
    """The cycle's phases, in order, under the queue's lease: recover what a killed run of this
    table left, complete interrupted operator actions, select what is due, screen it, deliver it,
    commit, and after the commit run clean-up hooks and offer what was sent."""
    started = time.perf_counter()
    report = CycleReport(writer.tables.queue, table)
    seq = _recover(declaration, writer, table, report)
    writer.check()
    report.interrupted = complete_actions(declaration, writer, run_id)
    settle_intake(writer)
    report.skipped = _closed(writer)
    if report.skipped is not None:
        report.probe = _probing(declaration, writer, table) if probe else 0
        if not report.probe:
            return report
        report.skipped = None
    now = now or datetime.now(UTC)
    due = _select(writer, table, now, report, limit_rows=report.probe or None)
    if due is not None:
        entry = _plan(writer, table, seq, run_id, now, due, report.probe)
        spec, deliver, held = _screen(spark, declaration, writer, table, now, run_id, entry, due)
        inflight = writer.tables.work_uri("inflight", table, writer.lease.holder_id)
        with held:
            report.worker_deaths = _stage(deliver, spec, inflight)
        report.seq = seq
        report.counts = _commit(declaration, writer, entry)
    _after_commit(declaration, writer, now, run_id, report, delivered=due is not None)
    report.duration_s = time.perf_counter() - started
    return report


def _recover(declaration: Declaration, writer: QueueWriter, table: str, report: CycleReport) -> int:
    """Finish the commit of a run of this table killed after staging, or drop what a run killed
    before staging computed; the seq this cycle takes."""
    tables = writer.tables
    # What every cycle reads first, loaded at once.
    writer.prefetch([JOURNAL, table, EVENTS, ACTIONS, PLANS])
    previous = read_entry(tables, table, snapshot=writer.latest_if_exists(JOURNAL))
    if previous is None:
        return 1
    if previous.state == "staged":
        writer.check()
        report.recovered = finish_staged(declaration, writer, previous, fresh=False)
    elif previous.state == "planned":
        remove_tree(previous.staging, tables.storage_options)  # a compute that died: nothing of it was committed
    return previous.seq if previous.state == "planned" else previous.seq + 1


def _closed(writer: QueueWriter) -> str | None:
    """Why this queue takes nothing now (disabled), or None."""
    tables = writer.tables
    state = queue_state(tables, snapshot=writer.latest_if_exists(EVENTS))
    return None if state.enabled else f"queue {tables.queue!r} is disabled: {state.reason}"


def _probing(declaration: Declaration, writer: QueueWriter, table: str) -> int:
    """How many messages a probe of this disabled queue tries: its policy's `probe.messages` when
    it is the inbound of a queue an outage disabled and its policy probes; else 0."""
    policy = declaration.queue(writer.tables.queue).policy
    state = queue_state(writer.tables, snapshot=writer.latest_if_exists(EVENTS))
    if table != INBOUND or not probed(policy, state.enabled, state.reason):
        return 0
    return policy.probe.messages


def _select(writer: QueueWriter, table: str, now: datetime, report: CycleReport,
            limit_rows: int | None = None) -> TableStats | None:
    """The table's due messages (its files and counts), or None when none is due; `limit_rows`:
    only the oldest due batches holding that many (a probe)."""
    stats = writer.tables.stats(table, now, snapshot=writer.latest(table), limit_rows=limit_rows)
    if stats.oldest is not None:
        report.oldest_age_s = (now - stats.oldest).total_seconds()
    if not stats.due_files:
        report.skipped = "no message is due"
        return None
    # What a cycle with due messages reads and commits to, loaded at once.
    writer.prefetch([PROCESSED, ATTEMPTS, CONVERSATIONS, TRANSMISSION])
    return stats


def _plan(writer: QueueWriter, table: str, seq: int, run_id: str, now: datetime, due: TableStats,
          probe: int = 0) -> JournalEntry:
    """The journal's record that this seq takes these batches, before anything is computed."""
    # Per holder: a holder that lost its lease and still computes never writes where the next one stages.
    entry = JournalEntry(seq, "planned", table, run_id, now.isoformat(), list(due.due_batches),
                         writer.tables.work_uri("staging", table, f"{seq}-{writer.lease.holder_id}"), probe=probe)
    write_entry(writer, entry)
    return entry


def _screen(spark: SessionSource, declaration: Declaration, writer: QueueWriter, table: str, now: datetime,
            run_id: str, entry: JournalEntry, due: TableStats
            ) -> tuple[CycleSpec, Callable[[CycleSpec], None], contextlib.ExitStack]:
    """What delivery needs: the spec (duplicates, ended and blocked conversations found), the
    delivery itself (beside the driver for a small cycle, a Spark job for a big one), and what the
    big path caches for its job, to release once it is done."""
    tables = writer.tables
    queue_decl = declaration.queue(tables.queue)
    # A small cycle is delivered beside the driver, without a Spark job (engine/local.py).
    # A probe tries its few messages one after the other: beside the driver, never as Spark tasks.
    local_delivery = due.due_rows <= declaration.small_cycles.max_messages or entry.probe > 0
    if local_delivery:
        local.warm()  # the worker's fork server starts (once per process) while dedup runs
    ordered = queue_decl.policy.ordering is Ordering.CONVERSATION
    window_start = (now - queue_decl.policy.dedup_window).date().isoformat()
    ledger = Ledger.within(tables, window_start, snapshot=writer.latest(PROCESSED))
    # A small cycle screens its messages with sets in its spec, found on the driver; a big one with
    # columns joined in Spark, so that nothing per message is collected on the driver.
    small = local_delivery or due.due_rows <= SMALL_BATCH
    batch: DataFrame | None = None
    # A session serves many cycles (a Connect server, the warm launcher): what the big path caches
    # for its delivery job is released once that job is done, or each cycle would keep its own.
    held = contextlib.ExitStack()
    # Delivered beside the driver, the rows are read once, for dedup and delivery: each due file
    # costs an open, and a queue fed by small enqueues has hundreds.
    rows = local.read_due(due.due_files, tables.storage_options) if local_delivery else None
    if small:
        duplicates = find_duplicates(rows.select(_ID_COLUMNS) if rows is not None else _due_ids(tables, table, due),
                                     ledger)
    else:
        duplicates = Duplicates(frozenset(), frozenset())
        session = _session(spark)
        batch = _due(session, tables, due)
        batch = mark_ended(session, mark_duplicates(session, batch, ledger, held), tables)
        if ordered:
            batch = mark_blocked(session, batch, tables, table)
    spec = CycleSpec(
        queue=tables.queue,
        table=table,
        probe=entry.probe,
        last_retry=tables.last_retry,
        policy=queue_decl.policy,
        poison=queue_decl.poison_queue,
        handler=queue_decl.poison_queue.handler if table == "poison" else queue_decl.handler,
        now=now,
        # Short: Delta truncates string statistics at 64 characters and batches are found by them.
        out_batch=f"{table}-{entry.seq}-{run_id[:8]}",
        seen=duplicates.seen,
        losers=duplicates.losers,
        ended=frozenset(ended_conversations(tables, snapshot=writer.latest_if_exists(CONVERSATIONS)))
        if small else frozenset(),
        blocked=blocked_conversations(tables, table, list(due.due_batches)) if ordered and small else {},
        guard=LeaseGuard.of(writer.lease),
        storage_options=tables.storage_options,
    )
    if rows is not None:
        rows = sorted_in_conversation_order(rows) if ordered else rows
        return spec, functools.partial(local.stage, rows, staging=entry.staging), held
    if batch is None:
        batch = _due(_session(spark), tables, due)
    deliver = functools.partial(stage_on_spark, in_conversation_order(batch) if ordered else batch,
                                staging=entry.staging, null_columns=due.null_columns)
    return spec, deliver, held


def _commit(declaration: Declaration, writer: QueueWriter, entry: JournalEntry) -> dict[str, float]:
    """Record the staged results as staged (a kill from here on is finished by the next run, never
    computed again), then apply them to the tables."""
    writer.check()
    entry.state = "staged"
    write_entry(writer, entry)
    return finish_staged(declaration, writer, entry, fresh=True)


def _after_commit(declaration: Declaration, writer: QueueWriter, now: datetime, run_id: str, report: CycleReport,
                  delivered: bool) -> None:
    """What follows the commit and never undoes it: the clean-up hooks of ended conversations that
    have not run through (this cycle's and earlier ones'), and, after a delivery, what its handlers
    sent offered to its targets."""
    tables = writer.tables
    retry_cleanups(declaration, writer, now)
    if delivered and pending_count(tables, snapshot=writer.latest_if_exists(TRANSMISSION)):
        writer.check()
        sent = transmit(declaration, tables.queue, now, run_id, within=writer)
        report.counts.update({"transmitted": sum(sent.delivered.values()), "conversation_errors": len(sent.failures),
                              "unsent": sent.unsent})
