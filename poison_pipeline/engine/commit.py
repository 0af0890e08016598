"""Committing a staged cycle to the Delta tables, each commit at most once.

Every append carries the Delta app transaction (queue/table, cycle seq) so a replay skips what is
already committed; the source batches are removed last, by a delete that a replay makes a no-op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.broker.conversations import end_conversation
from poison_pipeline.domain.alerts import (
    MESSAGES_FAILED,
    QUEUE_RECOVERED,
    FailureCount,
    failures_to_json,
    summarise_failures,
)
from poison_pipeline.domain.conversation_errors import MAX_DESCRIPTION
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.errors import NO_VALUE, group_id, group_key
from poison_pipeline.domain.outage import OUTAGE_SUSPECTED
from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, POISON, PROCESSED, QUARANTINE, STAY, Disposition
from poison_pipeline.engine.changes import decode_sent
from poison_pipeline.engine.id_hashes import HASH_COLUMN, id_hashes
from poison_pipeline.engine.staged import dataset as staged_rows
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import PROBE_FAILED, QUEUE_DISABLED, event_row, state_commit
from poison_pipeline.storage.events import append_events
from poison_pipeline.storage.journal import JournalEntry
from poison_pipeline.storage.tables import ATTEMPTS, NOTIFICATIONS, TRANSMISSION, QueueTables, schema_of
from poison_pipeline.storage.writer import QueueWriter


def _staged(tables: QueueTables, entry: JournalEntry) -> pads.Dataset:
    return staged_rows(entry.staging, tables.storage_options)


def _batches(staged: pads.Dataset, columns: list[str],
             where: pads.Expression | None = None) -> Iterator[pa.RecordBatch]:
    """The staged rows in batches, read ahead little: pyarrow's default read-ahead (16 batches of
    128k rows) would hold millions of rows, bodies included, for a big cycle."""
    return staged.to_batches(columns=columns, filter=where, batch_size=_BATCH_ROWS, batch_readahead=2,
                             fragment_readahead=1)


_BATCH_ROWS = 65_536


class _Stream:
    """Record batches streamed into one commit, counted as they pass: the driver never holds a
    cycle's staged rows, whatever the batch size."""

    def __init__(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> None:
        self.schema = schema
        self.rows = 0
        self._batches = batches
        self._first: pa.RecordBatch | None = next((b for b in batches if b.num_rows), None)

    @property
    def empty(self) -> bool:
        return self._first is None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        first, self._first = self._first, None
        if first is not None:
            self.rows += first.num_rows
            yield first
        for batch in self._batches:
            self.rows += batch.num_rows
            yield batch

    def reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, iter(self))

    def drain(self) -> int:
        """Count what a replay found already committed."""
        for _ in self:
            pass
        return self.rows


def _attempt_rows(staged: pads.Dataset, entry: JournalEntry, cycle: int, now: datetime) -> Iterator[pa.RecordBatch]:
    for batch in _batches(staged, ["message_id", "attempts", "destination", "due_at"]):
        parents = pc.list_parent_indices(batch["attempts"])
        flat = pc.list_flatten(batch["attempts"])
        ids = pc.take(batch["message_id"], parents)
        attempts = pa.Table.from_struct_array(flat) if len(flat) else None
        columns: dict[str, pa.Array] = {"message_id": ids}
        for field in schemas.ATTEMPT_FIELDS:
            columns[field.name] = attempts.column(field.name) if attempts else pa.array([], field.type)
        columns["retry_delay_ms"] = _retry_delays(batch, parents, now)
        built = schemas.project(pa.table(columns), schemas.ATTEMPTS, table=entry.table, cycle=cycle,
                                run_id=entry.run_id, cycle_seq=entry.seq, date=now.date().isoformat())
        yield from built.to_batches()


def _retry_delays(batch: pa.RecordBatch, parents: pa.Array, now: datetime) -> pa.Array:
    """Per attempt: on each message's last one, the delay before the retry cycle it moved to."""
    retried = pc.starts_with(batch["destination"], "retry_")
    waits = pc.divide(pc.cast(pc.subtract(batch["due_at"], pa.scalar(now, schemas.TS)), pa.int64()), 1000.0)
    per_message = pc.if_else(retried, waits, pa.scalar(None, pa.float64()))
    owners = parents.to_numpy(zero_copy_only=False)
    last = np.append(owners[1:] != owners[:-1], True) if len(owners) else np.zeros(0, dtype=bool)
    return pc.if_else(pa.array(last), pc.take(per_message, parents), pa.scalar(None, pa.float64()))


def _projected(staged: pads.Dataset, destination: str, schema: pa.Schema,
               build: Callable[[pa.Table], pa.Table]) -> Iterator[pa.RecordBatch]:
    # Only the columns the target keeps: the staged bodies of processed messages stay unread.
    columns = [name for name in staged.schema.names if name in schema.names or name == HASH_COLUMN]
    for batch in _batches(staged, columns, pc.field("destination") == destination):
        yield from build(pa.Table.from_batches([batch])).to_batches()


def _summary(staged: pads.Dataset) -> Counter[tuple[str, str]]:
    """How many staged messages go to each (destination, disposition)."""
    counted: Counter[tuple[str, str]] = Counter()
    for batch in _batches(staged, ["destination", "disposition"]):
        groups = pa.Table.from_batches([batch]).group_by(["destination", "disposition"], use_threads=False)
        for row in groups.aggregate([([], "count_all")]).to_pylist():
            counted[(row["destination"], row["disposition"])] += row["count_all"]
    return counted


class SequenceReused(RuntimeError):
    """A new cycle found its sequence number already committed to a table: its journal is behind
    the tables. Nothing of the cycle is committed and its input stays where it is."""


def apply_staged(writer: QueueWriter, entry: JournalEntry, cycle: int,
                 contracts: dict[str, str] | None = None, fresh: bool = False) -> dict[str, float]:
    """Commit a staged cycle; return the counts per disposition and of attempts. `contracts` are
    the declared queues' contracts, recorded with what the cycle's handlers sent to them. A `fresh`
    cycle (staged by this run, not recovered) must find none of its commits made already."""
    tables = writer.tables
    now = datetime.fromisoformat(entry.started_at)
    staged = _staged(tables, entry)
    app_id = f"poison_pipeline/{tables.queue}/{entry.table}"

    def reused(table: str) -> SequenceReused:
        return SequenceReused(
            f"{tables.describe(table)} already has a commit of the {entry.table} cycle {entry.seq}, which this "
            "run staged as new: the journal is behind the tables. Nothing more is committed and the cycle's "
            "messages stay where they are; report this as a defect")

    def commit(table: str, data: pa.Table) -> None:
        if data.num_rows and not writer.append(table, data, app_id=app_id, version=entry.seq) and fresh:
            raise reused(table)

    def commit_stream(table: str, data: _Stream) -> int:
        if not data.empty and not writer.append(table, data.reader(), app_id=app_id, version=entry.seq):
            if fresh:
                raise reused(table)
            data.drain()
        return data.rows

    attempts = commit_stream(ATTEMPTS, _Stream(schemas.ATTEMPTS, _attempt_rows(staged, entry, cycle, now)))
    summary = _summary(staged)
    destinations = {destination for destination, _ in summary}
    builders: dict[str, Callable[[pa.Table], pa.Table]] = {
        PROCESSED: lambda rows: schemas.project(_hashed(rows), schemas.PROCESSED, from_table=entry.table, at=now,
                                                date=now.date().isoformat(), cycle_seq=entry.seq),
        DEAD_LETTER: lambda rows: schemas.project(rows, schemas.DEAD_LETTER, from_table=entry.table,
                                                  dead_lettered_at=now),
        QUARANTINE: lambda rows: schemas.project(rows, schemas.QUARANTINE, from_table=entry.table,
                                                 quarantined_at=now),
    }
    for destination in sorted(destinations):
        build = builders.get(destination, lambda rows: schemas.project(rows, schemas.MESSAGE))
        target = entry.table if destination == STAY else destination
        schema = schema_of(target)
        commit_stream(target, _Stream(schema, _projected(staged, destination, schema, build)))
    commit(TRANSMISSION, _sent_rows(staged, tables.queue, entry, now, contracts or {}))
    dispositions = {disposition for _, disposition in summary}
    # Each of these reads the staged data again: only when the cycle had such messages at all.
    if Disposition.REJECTED.value in dispositions:
        commit(NOTIFICATIONS, _negative_acknowledgements(staged, entry, now))
    disables = _disable_events(staged, entry, now) if not entry.probe and dispositions & {
        Disposition.FAULTED.value, Disposition.OUTAGE.value} else []
    failed = _failed_event(staged, entry, now) if destinations & set(FAILURE_TABLES) else []
    probe = _probe_event(staged, entry, now, counts=summary) if entry.probe else None
    # One commit under the cycle's app transaction: a replay writes neither event again.
    recovered = [probe] if probe is not None and probe["kind"] == QUEUE_RECOVERED else []
    if disables or recovered:
        events, state = state_commit(tables, [*(disables or recovered), *failed], enabled=not disables)
        append_events(writer, events, app_id=app_id, version=entry.seq, also=[state])
    elif probe is not None:
        append_events(writer, pa.Table.from_pylist([probe, *failed], schema=schemas.EVENTS), app_id=app_id,
                      version=entry.seq)
    elif failed:
        append_events(writer, pa.Table.from_pylist(failed, schema=schemas.EVENTS), app_id=app_id, version=entry.seq)
    writer.remove_batches(entry.table, entry.batches)
    counts: dict[str, float] = {}
    for (_, disposition), count in sorted(summary.items()):
        counts[disposition] = counts.get(disposition, 0) + count
    counts["messages"] = sum(summary.values())
    counts["attempts"] = attempts
    return counts


def _hashed(rows: pa.Table) -> pa.Table:
    """Rows with their id hash. Both delivery paths stage it; results staged by a version from
    before the ledger kept it, and recovered after an upgrade, are hashed here."""
    if rows[HASH_COLUMN].null_count == 0:
        return rows
    return rows.set_column(rows.schema.get_field_index(HASH_COLUMN), HASH_COLUMN,
                           id_hashes(rows["message_id"].to_pylist()))


def _sent_rows(staged: pads.Dataset, queue: str, entry: JournalEntry, now: datetime,
               contracts: dict[str, str]) -> pa.Table:
    """What successful attempts sent, released into this queue's transmission queue."""
    table = staged.to_table(columns=["message_id", "sent"], filter=pc.field("sent").is_valid())
    rows = []
    for source, data in zip(table["message_id"].to_pylist(), table["sent"].to_pylist(), strict=True):
        for sent in decode_sent(data):
            target, lifetime = sent["target"], sent["lifetime_s"]
            rows.append({**sent, "target_queue": target, "enqueued_at": now, "sender": queue,
                         "headers": list(sent["headers"].items()), "source_message_id": source,
                         "deadline": now + timedelta(seconds=lifetime) if lifetime is not None else None,
                         "original_conversation_id": sent["conversation_id"], "resend_count": 0,
                         "batch_id": f"tx-{entry.table}-{entry.seq}", "target_contract": contracts.get(target)})
    return pa.Table.from_pylist(rows, schema=schemas.TRANSMISSION)


def _negative_acknowledgements(staged: pads.Dataset, entry: JournalEntry, now: datetime) -> pa.Table:
    rejected = staged.to_table(
        columns=["message_id", "conversation_id", "sender", "total_abort_count", "last_error_type"],
        filter=(pc.field("disposition") == Disposition.REJECTED.value) & pc.field("sender").is_valid(),
    ).to_pylist()
    rows = [
        {
            "notification_id": f"nack-{entry.table}-{entry.seq}-{r['message_id']}",
            "recipient": r["sender"],
            "kind": "negative_acknowledgement",
            "message_id": r["message_id"],
            "conversation_id": r["conversation_id"],
            "code": None,
            "description": (
                f"rejected after {r['total_abort_count']} failed attempts"
                + (f"; last error {r['last_error_type']}" if r["last_error_type"] else "")
            ),
            "at": now,
        }
        for r in rejected
    ]
    return pa.Table.from_pylist(rows, schema=schemas.NOTIFICATIONS)


def _disable_events(staged: pads.Dataset, entry: JournalEntry, now: datetime) -> list[dict[str, object]]:
    """One queue_disabled event per cycle that faulted messages or stopped on an outage: an alert
    per cycle, not per message."""
    rows = []
    faulted = pc.field("disposition") == Disposition.FAULTED.value
    count, first = _count_and_first(staged, faulted)
    if count:
        ids = first["message_id"].to_pylist()
        reason = (f"{count} message(s) in {entry.table} faulted after their last retry cycle "
                  f"(receive_error_handling: fault): {_sample(ids, count)}; last error {first['last_error_type'][0]}")
        rows.append(event_row(QUEUE_DISABLED, now, "poison_pipeline", reason, ids[0], entry.table))
    returned = pc.field("disposition") == Disposition.OUTAGE.value
    total = staged.count_rows(filter=returned)
    if total:
        count, first = _count_and_first(staged, returned & (pc.list_value_length(pc.field("attempts")) > 0))
        ids = first["message_id"].to_pylist()
        error = first["last_error_type"][0] if count else None
        reason = (f"{OUTAGE_SUSPECTED}: {count} message(s) in a row in {entry.table} failed with {error}, an error "
                  "that points at a dependency (policy outage_errors), and nothing succeeded; the cycle stopped and "
                  f"returned {total} message(s) uncharged. Failed: {_sample(ids, count)}")
        rows.append(event_row(QUEUE_DISABLED, now, "poison_pipeline", reason, ids[0] if ids else None, entry.table))
    return rows


def _probe_event(staged: pads.Dataset, entry: JournalEntry, now: datetime,
                 counts: Counter[tuple[str, str]]) -> dict[str, object]:
    """What a probe found: a message processed (the queue resumes: QUEUE_RECOVERED, an enable), or
    the outage going on, or nothing conclusive (PROBE_FAILED: it stays disabled)."""
    processed = counts.get((PROCESSED, Disposition.PROCESSED.value), 0)
    tried = staged.count_rows(filter=pc.list_value_length(pc.field("attempts")) > 0)
    if processed:
        return event_row(QUEUE_RECOVERED, now, "poison_pipeline", f"probe: {processed} of {tried} message(s) "
                         f"tried in {entry.table} succeeded: the queue resumes")
    down = pc.field("disposition") == Disposition.OUTAGE.value
    count, first = _count_and_first(staged, down & (pc.list_value_length(pc.field("attempts")) > 0))
    error = first["last_error_type"][0] if count else None
    why = (f"the outage goes on: {first['message_id'][0]} failed with {error}" if count
           else f"none of the {tried} message(s) tried succeeded")
    return event_row(PROBE_FAILED, now, "poison_pipeline", f"probe: {why}; the queue stays disabled",
                     first["message_id"][0] if count else None, entry.table)


def _count_and_first(staged: pads.Dataset, where: pads.Expression) -> tuple[int, pa.Table]:
    """How many staged rows match, and the first few (an event names a sample, not every one)."""
    return (staged.count_rows(filter=where),
            staged.head(_SAMPLE, columns=["message_id", "last_error_type"], filter=where))


def failure_counts(staged: pads.Dataset) -> tuple[FailureCount, ...]:
    """What a cycle sent to poison, dead_letter and quarantine, per table and failure group (the
    group ids `groups` gives those rows there), biggest first within each table."""
    rows = staged.to_table(columns=["destination", "last_error_signature", "last_error_type", "reason", "message_id"],
                           filter=pc.field("destination").isin(list(FAILURE_TABLES)))
    counted = rows.group_by(["destination", "last_error_signature", "last_error_type", "reason"],
                            use_threads=False).aggregate([([], "count_all"), ("message_id", "min")])
    found: dict[tuple[str, str], FailureCount] = {}
    for row in counted.to_pylist():
        table, signature = row["destination"], row["last_error_signature"]
        # The poison table keeps no reason: its rows without an error are one group there.
        reason = None if table == POISON else row["reason"]
        key = (table, group_id(group_key(signature, reason)))
        error = row["last_error_type"] if signature is not None else f"no error: {reason or NO_VALUE}"
        before = found.get(key)
        count = row["count_all"] + (before.count if before else 0)
        examples = [i for i in (row["message_id_min"], before.example_id if before else None) if i is not None]
        example = min(examples) if examples else None
        found[key] = FailureCount(table, key[1], count, error, example)
    return tuple(sorted(found.values(), key=lambda f: (FAILURE_TABLES.index(f.table), -f.count, f.group)))


def _failed_event(staged: pads.Dataset, entry: JournalEntry, now: datetime) -> list[dict[str, object]]:
    """One messages_failed event per cycle that failed messages: an alert per cycle, not per message."""
    failures = failure_counts(staged)
    if not failures:
        return []
    return [event_row(MESSAGES_FAILED, now, "poison_pipeline", summarise_failures(entry.table, entry.seq, failures),
                      failures[0].example_id, entry.table, run_id=entry.run_id, cycle_seq=entry.seq,
                      failures=failures_to_json(failures))]


_SAMPLE = 5


def _sample(ids: list[str], count: int) -> str:
    return ", ".join(ids[:_SAMPLE]) + (", ..." if count > _SAMPLE else "")


def end_failed_conversations(declaration: Declaration, writer: QueueWriter, entry: JournalEntry) -> dict[str, float]:
    """End with an error every conversation whose message failed for good in this cycle under
    `on_conversation_poison: end_conversation`: the rest of it leaves every table and its senders
    are told; its clean-up hook runs after the commit (the cycle's `_after_commit`). Safe to
    repeat: ending is idempotent."""
    tables = writer.tables
    heads = _staged(tables, entry).to_table(
        columns=["conversation_id", "message_id", "last_error_type", "last_error_message", "attempts"],
        filter=(pc.field("disposition") == Disposition.ENDED.value) & pc.field("conversation_id").is_valid(),
    )
    # The message that failed made attempts; held ones and late arrivals of ended conversations did not.
    heads = heads.filter(pc.greater(pc.list_value_length(heads["attempts"]), 0))
    if heads.num_rows == 0:
        return {}
    code = declaration.queue(tables.queue).policy.conversation_error_code
    done: set[str] = set()
    for row in heads.select(["conversation_id", "message_id", "last_error_type", "last_error_message"]).to_pylist():
        if row["conversation_id"] in done:
            continue
        done.add(row["conversation_id"])
        description = (f"message {row['message_id']} could not be processed: "
                       f"{row['last_error_type']}: {row['last_error_message']}")[:MAX_DESCRIPTION]
        end_conversation(declaration, tables.queue, row["conversation_id"], code, description, actor="poison_pipeline",
                         clean_up=False, within=writer)
    return {"conversations_ended": len(done)}
