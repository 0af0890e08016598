"""The transmission queue (SPEC section 7): messages handlers sent wait here until the target queue
accepts them; a conversation that fails is resent, dead-lettered or left to its error class.

One call reads the transmission table once (version V) and then:

1. checks each conversation in sequence order: a target that is not declared (-8470) or whose
   contract changed since the messages were sent (-8469), a lifetime
   that expired (-8489), a message type the target does not accept (-8428) or a body that fails
   the target's validation (-8430) fails the conversation; a disabled target leaves it waiting;
2. appends the accepted messages to their targets' inbound tables and the messages of failed,
   non-resent conversations to this queue's dead_letter, each under the app transaction
   (`poison_pipeline:transmission/<queue>`, V + 1), so a replay of the same snapshot writes nothing
   twice;
3. tells this queue of every conversation error (a `conversation_error` notification);
4. rewrites the touched transmission batches in one commit: accepted and dead-lettered messages
   leave, and the pending messages of a conversation with a recoverable error are resent in their
   order and with their message types on a new conversation;
5. ends each failed conversation with its error (after the resend, as Service Broker requires:
   ending first would delete the pending messages).

A crash after step 2 and a new cycle's sends before the replay make the replay append the
accepted messages again: their message ids are unchanged, so the target drops the copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import DeltaTable

from poison_pipeline.broker.conversations import (
    CONVERSATION_ENDED,
    end_conversation,
    ended_conversations,
    unsent_as_dead_letter,
)
from poison_pipeline.domain.conversation_errors import CONTRACT_BREACH, RECOVERABLE, describe_code
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.envelope import EnvelopeError, check_body
from poison_pipeline.domain.names import AppTransaction, ResendName
from poison_pipeline.domain.policy import OnUndefinedError
from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import queue_state
from poison_pipeline.storage.intake import UNSENT, ensure_intake, record_intake
from poison_pipeline.storage.tables import NOTIFICATIONS, TRANSMISSION, QueueTables
from poison_pipeline.storage.writer import LeaseFreeAppender, QueueWriter, queue_writer

LIFETIME_EXPIRED = -8489
TARGET_DROPPED = -8470
TARGET_ALTERED = -8469
UNKNOWN_MESSAGE_TYPE = -8428
BODY_VALIDATION = -8430


@dataclass(frozen=True)
class ConversationFailure:
    conversation_id: str
    target: str
    code: int
    description: str
    action: str  # "resent" or "dead_lettered"
    new_conversation_id: str | None = None


@dataclass
class TransmitResult:
    queue: str
    delivered: dict[str, int] = field(default_factory=dict)
    waiting: int = 0
    failures: list[ConversationFailure] = field(default_factory=list)
    # Messages not sent because their conversation had ended (to this queue's dead_letter).
    unsent: int = 0

    @property
    def resent(self) -> int:
        return sum(1 for f in self.failures if f.action == "resent")


def _failure(declaration: Declaration, target: str, rows: list[dict], now: datetime) -> tuple[int, str] | None:
    """The system error a conversation fails with before its target would accept it, if any."""
    if target not in declaration.queues:
        return TARGET_DROPPED, f"target queue {target!r} is not declared (dropped)"
    contract = declaration.queue(target)
    altered = [r for r in rows if r["target_contract"] not in (None, contract.contract)]
    if altered:
        return TARGET_ALTERED, (f"queue {target!r} changed what it accepts (message_types or max_body_bytes) "
                                f"after message {altered[0]['message_id']} was sent")
    expired = [r for r in rows if r["deadline"] is not None and r["deadline"] <= now]
    if expired:
        return LIFETIME_EXPIRED, (f"the conversation's lifetime ended at {expired[0]['deadline'].isoformat()} "
                                  f"before queue {target!r} accepted its messages")
    for row in rows:
        if contract.message_types is not None and row["message_type"] not in contract.message_types:
            return UNKNOWN_MESSAGE_TYPE, (f"message {row['message_id']}: queue {target!r} does not accept "
                                          f"message type {row['message_type']!r}")
        try:
            check_body(row["body"] or b"", row["encoding"], contract.policy.max_body_bytes)
        except EnvelopeError as error:
            return BODY_VALIDATION, f"message {row['message_id']}: the body failed validation: {error}"
    return None


def _resends(code: int, declaration: Declaration, queue: str) -> bool:
    if code in RECOVERABLE:
        return True
    if code in CONTRACT_BREACH:
        return False
    return declaration.queue(queue).policy.on_undefined_error is OnUndefinedError.RESEND


def _resent(rows: list[dict], now: datetime, contract: str | None) -> tuple[str, list[dict]]:
    """The pending messages on a new conversation: same ids, types and order, fresh lifetime, sent
    under the target's current contract."""
    count = rows[0]["resend_count"] + 1
    original = rows[0]["original_conversation_id"] or rows[0]["conversation_id"]
    conversation = str(ResendName(original, count))
    out = []
    for position, row in enumerate(rows, start=1):
        lifetime = row["deadline"] - row["enqueued_at"] if row["deadline"] is not None else None
        out.append({**row, "conversation_id": conversation, "sequence_number": position, "enqueued_at": now,
                    "deadline": now + lifetime if lifetime is not None else None, "resend_count": count,
                    "target_contract": contract})
    return conversation, out


def _inbound_rows(rows: list[dict], batch_id: str, now: datetime) -> pa.Table:
    # A sent message enters its target's inbound as a new arrival.
    sent = pa.Table.from_pylist(rows, schema=schemas.TRANSMISSION)
    return schemas.project(sent, schemas.MESSAGE, **schemas.FRESH, enqueued_at=now, due_at=now, entered_at=now,
                           batch_id=batch_id)


def _dead_rows(rows: list[dict], reason: str, now: datetime) -> pa.Table:
    return unsent_as_dead_letter(pa.Table.from_pylist(rows, schema=schemas.TRANSMISSION), reason, now)


def transmit(declaration: Declaration, queue: str, now: datetime | None = None,
             run_id: str = "manual", *, within: QueueWriter | None = None) -> TransmitResult:
    """Offer this queue's pending sent messages to their targets; safe to run again after a crash.
    Holds the sending queue's lease (targets' inbound tables take appends without one, as enqueues)."""
    tables = QueueTables.of(declaration, queue)
    if not tables.exists(TRANSMISSION):
        return TransmitResult(queue)
    with queue_writer(tables, "transmission", run_id, within=within) as writer:
        return _transmit_held(declaration, writer, now or datetime.now(UTC))


def _transmit_held(declaration: Declaration, writer: QueueWriter, now: datetime) -> TransmitResult:
    tables = writer.tables
    queue = tables.queue
    result = TransmitResult(queue)
    snapshot = tables.open(TRANSMISSION)
    pending = snapshot.to_pyarrow_table()
    if pending.num_rows == 0:
        return result
    version = snapshot.version() + 1
    app = AppTransaction.transmission(queue)
    ordered = pending.sort_by([("conversation_id", "ascending"), ("sequence_number", "ascending"),
                               ("enqueued_at", "ascending"), ("message_id", "ascending")]).to_pylist()
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in ordered:
        groups.setdefault((row["target_queue"], row["conversation_id"]), []).append(row)

    accepted: dict[str, list[dict]] = {}
    dead: list[pa.Table] = []
    resent: list[dict] = []
    leaving: set[str] = set()
    notes: list[dict] = []
    ended = _ended_conversations(declaration, queue, {target for target, _ in groups})
    for (target, conversation), rows in groups.items():
        if conversation in ended[queue] or conversation in ended.get(target, ()):
            # Sent on a conversation that has ended since: Service Broker deletes such messages.
            dead.append(_dead_rows(rows, CONVERSATION_ENDED, now))
            leaving.update(r["message_id"] for r in rows)
            result.unsent += len(rows)
            continue
        failure = _failure(declaration, target, rows, now)
        if failure is None:
            if not queue_state(QueueTables.of(declaration, target)).enabled:
                result.waiting += len(rows)  # Service Broker keeps them until the target takes them
                continue
            accepted.setdefault(target, []).extend(rows)
            leaving.update(r["message_id"] for r in rows)
            continue
        code, description = failure
        description = f"{description} ({describe_code(code)})"
        notes.append({"notification_id": f"convErr-{queue}-{conversation}-{code}", "recipient": queue,
                      "kind": "conversation_error", "message_id": None, "conversation_id": conversation,
                      "code": code, "description": description, "at": now})
        leaving.update(r["message_id"] for r in rows)
        if _resends(code, declaration, queue):
            current = declaration.queues[target].contract if target in declaration.queues else None
            new_conversation, copies = _resent(rows, now, current)
            resent.extend(copies)
            result.failures.append(ConversationFailure(conversation, target, code, description, "resent",
                                                       new_conversation))
        else:
            dead.append(_dead_rows(rows, f"conversation_error {code}", now))
            result.failures.append(ConversationFailure(conversation, target, code, description, "dead_lettered"))

    for target, rows in accepted.items():
        target_tables = QueueTables.of(declaration, target)
        target_tables.ensure()
        appender = LeaseFreeAppender(target_tables)
        ensure_intake(appender, now)
        app_id = _named(target_tables, INBOUND, app, version)
        appender.append(INBOUND, _inbound_rows(rows, f"tx-{queue}-{version}", now), app_id=app_id, version=version)
        record_intake(appender, f"sent by {queue}", f"tx-{queue}-{version}", len(rows), now, app_id, version)
        result.delivered[target] = len(rows)
    if dead:
        ensure_intake(writer, now)
        unsent = pa.concat_tables(dead)
        app_id = _named(tables, DEAD_LETTER, app, version)
        writer.append(DEAD_LETTER, unsent, app_id=app_id, version=version)
        record_intake(writer, UNSENT, f"tx-{queue}-{version}", unsent.num_rows, now, app_id, version)
    if notes:
        writer.append(NOTIFICATIONS, pa.Table.from_pylist(notes, schema=schemas.NOTIFICATIONS),
                      app_id=_named(tables, NOTIFICATIONS, app, version), version=version)
    if leaving:
        touched = sorted({r["batch_id"] for r in ordered if r["message_id"] in leaving})
        keep = ~pads.field("message_id").isin(sorted(leaving))
        again: pa.Table | None = None
        if resent:
            again = pa.Table.from_pylist([{**r, "batch_id": touched[0]} for r in resent], schema=schemas.TRANSMISSION)
        writer.replace_batches(TRANSMISSION, touched, keep, snapshot=snapshot, add=again)
    for failed in result.failures:
        end_conversation(declaration, queue, failed.conversation_id, failed.code, failed.description,
                         actor="poison_pipeline", within=writer)
    return result


def _named(tables: QueueTables, table: str, app: AppTransaction, version: int) -> str:
    """The name of a transmission's commit to `table`: the earlier one when an earlier version made
    that commit already (a replay of its snapshot then writes nothing again), else its own."""
    if app.earlier_is_one_of_queue(tables.queue):
        # A queue named transmission: the earlier name is also one of its own cycles' (a commit of
        # its table named like the sender), which says nothing of this transmission.
        return app.name
    there = tables.open_if_exists(table)
    made = None if there is None else there.transaction_version(app.earlier)
    return app.earlier if made is not None and made >= version else app.name


def _ended_conversations(declaration: Declaration, queue: str, targets: set[str]) -> dict[str, set[str]]:
    """The conversations ended in the sending queue and in each declared target."""
    names = {queue, *(t for t in targets if t in declaration.queues)}
    return {name: set(ended_conversations(QueueTables.of(declaration, name))) for name in names}


def pending_count(tables: QueueTables, *, snapshot: DeltaTable | None = None) -> int:
    """Messages waiting in the transmission queue, from the Delta log alone. `snapshot`: the
    transmission table as the caller holds it, else it is loaded."""
    try:
        return tables.stats(TRANSMISSION, datetime.now(UTC), snapshot=snapshot).rows
    except FileNotFoundError:
        return 0

