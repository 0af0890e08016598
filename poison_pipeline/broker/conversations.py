"""Ending a conversation with an error (SPEC section 7; Service Broker's END CONVERSATION WITH ERROR).

Every step can be repeated, so running it again after a crash anywhere finishes the job and
duplicates nothing:

1. the end is recorded once in the queue's `conversations` table (an app transaction per
   conversation guards against two operators recording it at once);
2. a `conversation_ended` event says who, when and why (its event id is derived from the
   conversation, so it is written once);
3. per waiting table, the conversation's messages are appended to `dead_letter` under an app
   transaction versioned by the source table's version that was read, and only then removed from
   the source (its batches rewritten without them, in one commit): a replay before the removal
   skips the append, and a replay after the source changed appends only the rows not in
   `dead_letter` yet;
4. every sender of those messages gets one `conversation_error` notification (derived id);
5. the declared clean-up hook runs, then a `conversation_cleanup` event records that it did. A crash
   between the two runs the hook again on the next call: hooks run at least once, so they should
   be safe to repeat.

Only delta-rs and pyarrow are used: no Spark session is needed to end a conversation.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable

from poison_pipeline.domain.conversation_errors import (
    MAX_DESCRIPTION,
    ConversationError,
    check_code,
    check_text,
    describe_code,
)
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED
from poison_pipeline.domain.user_code import call_hook
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import event_row
from poison_pipeline.storage.intake import UNSENT, ensure_intake, record_intake
from poison_pipeline.storage.tables import CONVERSATIONS, EVENTS, NOTIFICATIONS, TRANSMISSION, QueueTables
from poison_pipeline.storage.writer import QueueWriter, queue_writer

ENDED = "ended"
# The dead-letter reason of the messages removed and the event kind of the end itself.
CONVERSATION_ENDED = "conversation_ended"
CONVERSATION_ERROR = "conversation_error"
CONVERSATION_CLEANUP = "conversation_cleanup"
CONVERSATION_CLEANUP_FAILED = "conversation_cleanup_failed"


@dataclass(frozen=True)
class EndRecord:
    """The recorded end of a conversation: the first call's code, description, actor and time."""

    conversation_id: str
    code: int
    description: str
    actor: str
    at: datetime


@dataclass(frozen=True)
class EndResult:
    queue: str
    conversation_id: str
    # True when an earlier call recorded the end; code, description, actor and ended_at are then
    # the recorded ones, not this call's.
    already_ended: bool
    code: int
    description: str
    actor: str
    ended_at: datetime
    # Messages this call moved to dead_letter, per waiting table (every waiting table is listed).
    removed: dict[str, int] = field(default_factory=dict)
    # Senders this call notified; those notified by an earlier call are not repeated.
    notified: tuple[str, ...] = ()
    hook: str | None = None
    hook_ran: bool = False
    hook_ran_before: bool = False
    hook_error: str | None = None
    # Messages still waiting to be sent on the conversation that this call deleted, per sending
    # queue (this queue's own sends on it, and other queues' sends on it to this queue).
    unsent: dict[str, int] = field(default_factory=dict)

    @property
    def removed_total(self) -> int:
        return sum(self.removed.values())

    @property
    def kind(self) -> str:
        return describe_code(self.code)


def end_conversation(
    declaration: Declaration,
    queue: str,
    conversation_id: str,
    code: int,
    description: str,
    actor: str,
    now: datetime | None = None,
    *,
    clean_up: bool = True,
    within: QueueWriter | None = None,
) -> EndResult:
    """End `conversation_id` in `queue` with an error; safe to call again (see the module doc).

    Raises ConversationError for an invalid request, before anything is written. A failing clean-up
    hook does not raise: the result carries `hook_error`, and the next call retries the hook.
    `clean_up=False` leaves the hook to the caller's next step (a cycle runs hooks after its commit:
    `retry_cleanups`), never inside a commit.
    """
    check_end_request(declaration, queue, conversation_id, code, description, actor)
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    with queue_writer(tables, "end-conversation", within=within) as writer:
        return _end_held(declaration, writer, conversation_id, code, description, actor, now or datetime.now(UTC),
                         clean_up)


def _end_held(declaration: Declaration, writer: QueueWriter, conversation_id: str, code: int, description: str,
              actor: str, now: datetime, clean_up: bool) -> EndResult:
    tables = writer.tables
    queue = tables.queue
    record, already = _record_end(writer, EndRecord(conversation_id, code, description, actor, now))
    _event_once(writer, _id("evt", CONVERSATION_ENDED, queue, conversation_id), CONVERSATION_ENDED,
                record.at, record.actor, _ended_reason(record))
    removed = {table: _move_to_dead_letter(writer, table, conversation_id, now) for table in tables.waiting}
    unsent = _drop_pending_sends(declaration, writer, conversation_id, now)
    notified = _notify_senders(declaration, writer, record, now)
    hook = declaration.queue(queue).on_conversation_end
    ran, ran_before, error = (_clean_up(writer, hook, declaration.hook_timeout, record, actor, now) if clean_up
                              else (False, False, None))
    return EndResult(queue, conversation_id, already, record.code, record.description, record.actor,
                     record.at, removed, notified, hook, ran, ran_before, error, unsent)


def check_end_request(declaration: Declaration, queue: str, conversation_id: str, code: int,
                      description: str, actor: str) -> None:
    """Raise ConversationError naming the first thing wrong with a request to end a conversation."""
    if queue not in declaration.queues:
        raise ConversationError(f"no queue {queue!r} is declared; declared: {', '.join(declaration.queues)}")
    check_text("conversation_id", conversation_id)
    check_code(code)
    check_text("description", description, MAX_DESCRIPTION)
    check_text("actor", actor)


def ended_conversations(source: Declaration | QueueTables, queue: str | None = None, *,
                        snapshot: DeltaTable | None = None) -> dict[str, tuple[int, str]]:
    """conversation_id -> (code, description) of every conversation ended in a queue.

    Reads five narrow columns of one small table (one row per ended conversation), so a cycle can
    afford it to dead-letter messages of an ended conversation that arrive later. `snapshot`: that
    table as the caller holds it, else it is loaded.
    """
    tables = _tables(source, queue)
    ledger = snapshot if snapshot is not None else tables.open_if_exists(CONVERSATIONS)
    if ledger is None:
        return {}
    columns = ["conversation_id", "state", "code", "description", "at"]
    rows = ledger.to_pyarrow_table(columns=columns)
    rows = rows.filter(pc.equal(rows["state"], ENDED)).sort_by([("at", "descending")])
    # Sorted newest first so the earliest record of a conversation is the one kept.
    return {r["conversation_id"]: (r["code"], r["description"]) for r in rows.to_pylist()}


def conversation_queues(declaration: Declaration, conversation_id: str) -> list[str]:
    """The queues where the conversation has waiting or dead-lettered messages, ledger rows or an
    end on record; the file statistics let the filtered reads skip most files."""
    found = []
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        for table in (*tables.waiting, DEAD_LETTER, PROCESSED, CONVERSATIONS):
            if tables.exists(table) and _any_row(tables.open(table), conversation_id):
                found.append(queue)
                break
    return found


def _tables(source: Declaration | QueueTables, queue: str | None) -> QueueTables:
    if isinstance(source, QueueTables):
        if queue is not None and queue != source.queue:
            raise ValueError(f"queue {queue!r} given with the tables of queue {source.queue!r}")
        return source
    if queue is None:
        raise ValueError("name the queue: ended_conversations(declaration, queue)")
    return QueueTables.of(source, queue)


def _any_row(target: DeltaTable, conversation_id: str) -> bool:
    dataset = target.to_pyarrow_dataset()
    found = dataset.head(1, columns=["conversation_id"], filter=pads.field("conversation_id") == conversation_id)
    return bool(found.num_rows)


def _id(prefix: str, kind: str, *parts: str) -> str:
    # Conversation ids and senders are free text: a digest gives short ids with no separators in them.
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]
    return f"{prefix}-{kind}-{digest}"


def _app_id(tables: QueueTables, purpose: str, conversation_id: str, table: str | None = None) -> str:
    return f"poison_pipeline/{tables.queue}/{_id(purpose, 'conversation', conversation_id)}" + (
        f"/{table}" if table else "")


def _ended_reason(record: EndRecord) -> str:
    return (f"conversation {record.conversation_id!r} ended with error {record.code} "
            f"({describe_code(record.code)}): {record.description}")


def _recorded(tables: QueueTables, conversation_id: str) -> EndRecord | None:
    dataset = tables.open(CONVERSATIONS).to_pyarrow_dataset()
    rows = dataset.to_table(
        filter=(pads.field("conversation_id") == conversation_id) & (pads.field("state") == ENDED)
    ).sort_by([("at", "ascending")]).to_pylist()
    if not rows:
        return None
    first = rows[0]
    return EndRecord(conversation_id, first["code"], first["description"], first["actor"], first["at"])


def _record_end(writer: QueueWriter, wanted: EndRecord) -> tuple[EndRecord, bool]:
    """The recorded end, and whether it was recorded before this call."""
    tables = writer.tables
    existing = _recorded(tables, wanted.conversation_id)
    if existing is not None:
        return existing, True
    row = {"conversation_id": wanted.conversation_id, "state": ENDED, "code": wanted.code,
           "description": wanted.description, "actor": wanted.actor, "at": wanted.at}
    data = pa.Table.from_pylist([row], schema=schemas.CONVERSATIONS)
    if writer.append(CONVERSATIONS, data, app_id=_app_id(tables, "end", wanted.conversation_id), version=1):
        return wanted, False
    # Another call recorded it between our read and our append: theirs is the end.
    existing = _recorded(tables, wanted.conversation_id)
    return (existing or wanted), True


def _event_once(writer: QueueWriter, event_id: str, kind: str, at: datetime, actor: str, reason: str) -> bool:
    tables = writer.tables
    if _has_event(tables, event_id):
        return False
    row = {**event_row(kind, at, actor, reason), "event_id": event_id}
    writer.append(EVENTS, pa.Table.from_pylist([row], schema=schemas.EVENTS))
    return True


def _has_event(tables: QueueTables, event_id: str) -> bool:
    dataset = tables.open(EVENTS).to_pyarrow_dataset()
    return bool(dataset.head(1, columns=["event_id"], filter=pads.field("event_id") == event_id).num_rows)


def _as_dead_letter(rows: pa.Table, from_table: str, now: datetime) -> pa.Table:
    if from_table == TRANSMISSION:
        return unsent_as_dead_letter(rows, CONVERSATION_ENDED, now)
    return schemas.project(rows, schemas.DEAD_LETTER, reason=CONVERSATION_ENDED, from_table=from_table,
                           dead_lettered_at=now)


def unsent_as_dead_letter(sent: pa.Table, reason: str, now: datetime) -> pa.Table:
    """Messages of a transmission table that will never be sent, as the sender's dead-letter rows."""
    return schemas.project(sent, schemas.DEAD_LETTER, **schemas.FRESH, due_at=now, entered_at=now, reason=reason,
                           from_table=TRANSMISSION, dead_lettered_at=now)


def _already_moved(tables: QueueTables, conversation_id: str, from_table: str) -> set[tuple[str, str | None]]:
    """(message_id, batch_id) of the rows an earlier call moved from `from_table`: a batch id names
    one stay of a message in a waiting table, so a message redriven since is not mistaken for one."""
    dataset = tables.open(DEAD_LETTER).to_pyarrow_dataset()
    rows = dataset.to_table(
        columns=["message_id", "batch_id"],
        filter=(pads.field("conversation_id") == conversation_id)
        & (pads.field("reason") == CONVERSATION_ENDED)
        & (pads.field("from_table") == from_table),
    )
    return set(zip(rows["message_id"].to_pylist(), rows["batch_id"].to_pylist(), strict=True))


def _move_to_dead_letter(writer: QueueWriter, table: str, conversation_id: str, now: datetime,
                         within: pads.Expression | None = None) -> int:
    """Append the conversation's messages waiting in `table` (those matching `within`, if given) to
    dead_letter, then remove them there."""
    tables = writer.tables
    source = tables.open(table)
    version = source.version()
    match = pads.field("conversation_id") == conversation_id
    if within is not None:
        match = match & within
    rows = source.to_pyarrow_dataset().to_table(filter=match)
    if rows.num_rows == 0:
        return 0
    app_id = _app_id(tables, "end", conversation_id, table)
    committed = tables.open(DEAD_LETTER).transaction_version(app_id)
    # The same source version was read and appended before (a crash before the removal): skip.
    if committed is None or committed < version:
        pending = rows
        if committed is not None:
            # The source changed since an earlier append of this conversation: new arrivals join
            # rows that may already be in dead_letter; append only the new ones.
            moved = _already_moved(tables, conversation_id, table)
            keys = zip(rows["message_id"].to_pylist(), rows["batch_id"].to_pylist(), strict=True)
            pending = rows.filter(pa.array([key not in moved for key in keys], pa.bool_()))
        if pending.num_rows:
            if table == TRANSMISSION:
                ensure_intake(writer, now)
            writer.append(DEAD_LETTER, _as_dead_letter(pending, table, now), app_id=app_id, version=version)
            if table == TRANSMISSION:  # sends that never left: they enter their sender's dead_letter
                record_intake(writer, UNSENT, None, pending.num_rows, now, app_id, version)
    # A null comparison (a message without a conversation) is kept.
    _delete_moved(writer, table, source, ~match | match.is_null(), rows["batch_id"].to_pylist())
    return rows.num_rows


def _delete_moved(writer: QueueWriter, table: str, source: DeltaTable, keep: pads.Expression,
                  batch_ids: list[str | None]) -> None:
    # Only the batches that were read: a message of this conversation enqueued meanwhile is in a new
    # batch, was not appended to dead_letter, and must stay until the next call. The snapshot they
    # were read from makes a cycle that took those batches meanwhile fail this commit loudly.
    writer.replace_batches(table, batch_ids, keep=keep, snapshot=source)


def pending_senders(declaration: Declaration, queue: str, conversation_id: str) -> list[QueueTables]:
    """The other queues with sends on the conversation still waiting to go to `queue`: an end takes
    their leases too (read without a lease: one found now and gone by then changes nothing)."""
    found = []
    for sender in declaration.queues:
        tables = QueueTables.of(declaration, sender)
        if sender != queue and tables.exists(TRANSMISSION) and _any_row(tables.open(TRANSMISSION), conversation_id):
            found.append(tables)
    return found


def _drop_pending_sends(declaration: Declaration, writer: QueueWriter, conversation_id: str,
                        now: datetime) -> dict[str, int]:
    """Delete the messages still waiting to be sent on the conversation, as Service Broker deletes them
    from sys.transmission_queue when a conversation ends: this queue's own sends on it, and other
    queues' sends on it to this queue. Each sender finds them in its dead_letter (reason
    conversation_ended, from_table transmission); another queue's table is changed under its lease."""
    tables = writer.tables
    unsent = {}
    for sender in declaration.queues:
        own = sender == tables.queue
        sender_tables = tables if own else QueueTables.of(declaration, sender)
        if not sender_tables.exists(TRANSMISSION) or not _any_row(sender_tables.open(TRANSMISSION), conversation_id):
            continue
        within = None if own else pads.field("target_queue") == tables.queue
        with queue_writer(sender_tables, "end-conversation", within=writer) as sender_writer:
            count = _move_to_dead_letter(sender_writer, TRANSMISSION, conversation_id, now, within)
        if count:
            unsent[sender] = count
    return unsent


def _ended_rows(conversation_id: str) -> pads.Expression:
    return (pads.field("conversation_id") == conversation_id) & (pads.field("reason") == CONVERSATION_ENDED)


def _left_unsent(sender: QueueTables, ended: pads.Expression) -> bool:
    if not sender.exists(DEAD_LETTER):
        return False
    unsent = ended & (pads.field("from_table") == TRANSMISSION)
    return bool(sender.open(DEAD_LETTER).to_pyarrow_dataset().head(1, columns=["message_id"], filter=unsent).num_rows)


def _notify_senders(declaration: Declaration, writer: QueueWriter, record: EndRecord,
                    now: datetime) -> tuple[str, ...]:
    """One conversation_error notification per sender of a message the end removed or left unsent."""
    tables = writer.tables
    dead_letter = tables.open(DEAD_LETTER)
    # Senders come from dead_letter, not from this call's moves: after a crash that followed the
    # moves, the messages are no longer in the waiting tables but their senders still need telling.
    ended = _ended_rows(record.conversation_id)
    rows = dead_letter.to_pyarrow_dataset().to_table(columns=["sender"], filter=ended & pads.field("sender").is_valid())
    # And other queues whose sends on the conversation were deleted unsent, found in their own dead_letter.
    unsent = [q for q in declaration.queues
              if q != tables.queue and _left_unsent(QueueTables.of(declaration, q), ended)]
    senders = sorted(set(rows["sender"].to_pylist()) | set(unsent))
    if not senders:
        return ()
    ids = {s: _id("ntf", CONVERSATION_ERROR, tables.queue, record.conversation_id, s) for s in senders}
    written = tables.open(NOTIFICATIONS).to_pyarrow_dataset().to_table(
        columns=["notification_id"], filter=pads.field("notification_id").isin(list(ids.values())))
    done = set(written["notification_id"].to_pylist())
    new = [s for s in senders if ids[s] not in done]
    if not new:
        return ()
    data = pa.Table.from_pylist([
        {"notification_id": ids[s], "recipient": s, "kind": CONVERSATION_ERROR, "message_id": None,
         "conversation_id": record.conversation_id, "code": record.code, "description": record.description,
         "at": now}
        for s in new
    ], schema=schemas.NOTIFICATIONS)
    app_id = _app_id(tables, "notify", record.conversation_id)
    if not writer.append(NOTIFICATIONS, data, app_id=app_id, version=dead_letter.version()):
        return ()  # another call wrote them from the same dead_letter version
    return tuple(new)


def _clean_up(writer: QueueWriter, hook: str | None, timeout: timedelta, record: EndRecord, actor: str,
              now: datetime) -> tuple[bool, bool, str | None]:
    """Run the clean-up hook unless it already ran: (ran now, ran before, error)."""
    tables = writer.tables
    if hook is None:
        return False, False, None
    event_id = _cleanup_id(tables, record.conversation_id)
    if _has_event(tables, event_id):
        return False, True, None
    error = call_hook(hook, timeout, conversation_id=record.conversation_id, code=record.code,
                      description=record.description, queue=tables.queue)
    if error is not None:  # the application's code: whatever it raises is reported, not raised
        problem = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
        problem = problem.removeprefix("poison_pipeline.domain.user_code.")
        problem += f": {error}"
        row = event_row(CONVERSATION_CLEANUP_FAILED, now, actor,
                        f"clean-up hook {hook} failed for conversation {record.conversation_id!r}: {problem}")
        # One failure event per try, all named after the conversation so the last error can be found.
        row["event_id"] = f"{_failed_cleanup_prefix(tables, record.conversation_id)}{uuid.uuid4().hex}"
        writer.append(EVENTS, pa.Table.from_pylist([row], schema=schemas.EVENTS))
        return False, False, problem
    _event_once(writer, event_id, CONVERSATION_CLEANUP, now, actor,
                f"clean-up hook {hook} ran for conversation {record.conversation_id!r}")
    return True, False, None



def _cleanup_id(tables: QueueTables, conversation_id: str) -> str:
    return _id("evt", CONVERSATION_CLEANUP, tables.queue, conversation_id)


def _failed_cleanup_prefix(tables: QueueTables, conversation_id: str) -> str:
    return _id("evt", CONVERSATION_CLEANUP_FAILED, tables.queue, conversation_id) + "-"


@dataclass(frozen=True)
class UnfinishedCleanup:
    """An ended conversation whose clean-up hook has not run through yet, and its last error."""

    conversation_id: str
    last_error: str | None
    failures: int


def unfinished_cleanups(declaration: Declaration, tables: QueueTables) -> list[UnfinishedCleanup]:
    """The conversations ended in this queue whose declared clean-up hook has not succeeded yet."""
    if declaration.queue(tables.queue).on_conversation_end is None or not tables.exists(CONVERSATIONS):
        return []
    ended = sorted(ended_conversations(tables))
    if not ended:
        return []
    events = tables.open(EVENTS).to_pyarrow_dataset().to_table(
        columns=["event_id", "at", "reason"],
        filter=pads.field("kind").isin([CONVERSATION_CLEANUP, CONVERSATION_CLEANUP_FAILED]))
    ids = events["event_id"].to_pylist()
    done = set(ids)
    unfinished = []
    for conversation_id in ended:
        if _cleanup_id(tables, conversation_id) in done:
            continue
        prefix = _failed_cleanup_prefix(tables, conversation_id)
        failed = events.filter(pc.starts_with(events["event_id"], prefix)).sort_by([("at", "descending")])
        last = failed["reason"][0].as_py() if failed.num_rows else None
        unfinished.append(UnfinishedCleanup(conversation_id, last, failed.num_rows))
    return unfinished


def retry_cleanups(declaration: Declaration, writer: QueueWriter, now: datetime) -> None:
    """Run the clean-up hook again for every ended conversation whose hook has not succeeded yet
    (hooks are documented as safe to repeat); a failure is recorded again and retried next time."""
    tables = writer.tables
    hook = declaration.queue(tables.queue).on_conversation_end
    pending = {u.conversation_id for u in unfinished_cleanups(declaration, tables)}
    for conversation_id in sorted(pending):
        record = _recorded(tables, conversation_id)
        if record is not None:
            _clean_up(writer, hook, declaration.hook_timeout, record, "poison_pipeline", now)
