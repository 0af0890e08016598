"""`end-conversation`: an operator ends a conversation with an error in one queue or in every queue
where it appears, each end recorded in that queue's actions ledger (the workflow itself is
broker/conversations.py, shared with the engine's `on_conversation_poison: end_conversation`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import Field

from poison_pipeline.broker import conversations
from poison_pipeline.broker.conversations import EndResult, check_end_request, conversation_queues
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER
from poison_pipeline.operations.actions import Action, Recorded, new_action_id, operator_writer
from poison_pipeline.operations.requests import ActionContext, Request
from poison_pipeline.storage.tables import CONVERSATIONS, EVENTS, NOTIFICATIONS, QueueTables
from poison_pipeline.storage.writer import queue_writers


class EndConversationOptions(Request):
    """What ending a conversation takes besides where: the run config of a queue's job in Dagster."""

    conversation_id: str = Field(description="The conversation_id of the messages.")
    code: int = Field(description="The error code, non-zero: positive for an application error, negative for "
                      "a system error (e.g. -8489 lifetime expired).")
    description: str = Field(description="What went wrong, sent to the senders (non-empty, at most 3000 "
                             "characters).")


class EndConversationRequest(EndConversationOptions):
    """Ending a conversation with an error (Service Broker's END CONVERSATION WITH ERROR)."""

    queue: str | None = Field(default=None, description="Only this queue, even where the conversation has no "
                              "messages; default: every queue where it has messages, ledger rows or a recorded end.")


def end_conversation(declaration: Declaration, request: EndConversationRequest,
                     context: ActionContext | None = None) -> list[OperatorEnd]:
    """End the conversation in the request's queue, or in every queue where it appears (none: an
    empty list). Raises ConversationError, before any queue is changed, for a request that cannot be."""
    context = context or ActionContext()
    queues = queues_to_end(declaration, request.conversation_id, request.code, request.description,
                           context.actor, request.queue)
    now = context.now or datetime.now(UTC)
    return [end_conversation_by_operator(declaration, queue, request.conversation_id, request.code,
                                         request.description, context.actor, now, context.run_id)
            for queue in queues]


@dataclass(frozen=True)
class OperatorEnd:
    result: EndResult
    action: Action


def queues_to_end(declaration: Declaration, conversation_id: str, code: int, description: str, actor: str,
                  queue: str | None = None) -> list[str]:
    """The queues an operator's end applies to: `queue`, else every queue where the conversation has
    messages, ledger rows or a recorded end (none: an empty list). ConversationError naming the first
    thing wrong with the request, checked against every queue it could touch before any is changed."""
    queues = [queue] if queue is not None else list(declaration.queues)
    for name in queues:
        check_end_request(declaration, name, conversation_id, code, description, actor)
    return queues if queue is not None else conversation_queues(declaration, conversation_id)


def end_conversation_by_operator(declaration: Declaration, queue: str, conversation_id: str, code: int,
                                 description: str, actor: str, now: datetime | None = None,
                                 run_id: str = "manual") -> OperatorEnd:
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    touched = [(tables, t) for t in (*tables.waiting, DEAD_LETTER, CONVERSATIONS, EVENTS, NOTIFICATIONS)]
    # The senders whose pending sends on it are dropped too: all the leases, taken in the one order.
    senders = conversations.pending_senders(declaration, queue, conversation_id)
    with queue_writers([tables, *senders], "end-conversation", run_id) as first, \
            operator_writer(declaration, tables, "end-conversation", run_id, within=first) as writer:
        record = Recorded(writer, "end_conversation", new_action_id("end_conversation"))
        record.begin(actor, {"conversation_id": conversation_id, "code": code, "description": description}, touched,
                     run_id)
        result = conversations.end_conversation(declaration, queue, conversation_id, code, description, actor, now,
                                                within=writer)
        counts = {"removed": result.removed_total, "unsent": sum(result.unsent.values()),
                  "notified": len(result.notified), "already_ended": result.already_ended,
                  "hook_error": result.hook_error}
        action = record.finish(counts, touched)
    return OperatorEnd(result, action)
