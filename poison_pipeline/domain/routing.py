"""Where a message goes after a cycle: the routing rules of WCF over MSMQ 4.0 (SPEC section 6)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from poison_pipeline.domain.policy import (
    OnConversationPoison,
    PoisonQueuePolicy,
    Policy,
    ReceiveErrorHandling,
    UnrecoverableRoute,
)

INBOUND = "inbound"
POISON = "poison"
DEAD_LETTER = "dead_letter"
QUARANTINE = "quarantine"
PROCESSED = "processed"
# A faulted message stays where it failed: it is written back to the table it was taken from.
STAY = "stay"


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    EXHAUSTED = "exhausted"
    UNRECOVERABLE = "unrecoverable"


class Disposition(StrEnum):
    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    DROPPED = "dropped"
    REJECTED = "rejected"
    EXPIRED = "expired"
    MOVED = "moved"
    POISONED = "poisoned"
    QUARANTINED = "quarantined"
    FAULTED = "faulted"
    ENDED = "ended"
    # Not attempted: an earlier message of its conversation waits upstream; it stays where it is.
    HELD = "held"
    # Returned where it was, uncharged: the cycle stopped because a dependency looked down.
    OUTAGE = "outage"


@dataclass(frozen=True)
class Route:
    destination: str
    disposition: Disposition
    reason: str | None = None

    @property
    def notifies_sender(self) -> bool:
        return self.disposition is Disposition.REJECTED

    @property
    def disables_queue(self) -> bool:
        return self.disposition is Disposition.FAULTED


def retry_table(cycle: int) -> str:
    return f"retry_{cycle}"


def waiting_tables(policy: Policy, draining: int = 0) -> list[str]:
    """The tables a message can wait in, in the order of the flow. `draining`: the last retry
    subqueue beyond the policy's that still holds messages, left by a declaration with more retry
    cycles (max_retry_cycles lowered while they waited). It and those before it stay waiting tables
    until it is empty: each message there has its cycle, as the policy that sent it there said, and
    then its final disposition (route_main sends nothing further down than the policy's count)."""
    return tables_through(max(policy.max_retry_cycles, draining))


def tables_through(cycles: int) -> list[str]:
    """The waiting tables of a queue with `cycles` retry subqueues, in the order of the flow."""
    return [INBOUND, *(retry_table(k) for k in range(1, cycles + 1)), POISON]


def cycle_of(table: str) -> int:
    """Retry cycle number of a waiting table: 0 for inbound, k for retry_k."""
    if table == INBOUND:
        return 0
    if table.startswith("retry_"):
        return int(table.removeprefix("retry_"))
    raise ValueError(f"{table!r} is not the inbound queue or a retry subqueue")


# The tables that keep failed messages for people, and when a row failed: when it entered that table.
FAILURE_TABLES: tuple[str, ...] = (POISON, DEAD_LETTER, QUARANTINE)
FAILED_AT = {POISON: "entered_at", DEAD_LETTER: "dead_lettered_at", QUARANTINE: "quarantined_at"}


def cycle_number(table: str, policy: Policy) -> int:
    """The cycle a table's deliveries count as: the poison queue comes after the last retry cycle."""
    return policy.max_retry_cycles + 1 if table == POISON else cycle_of(table)


# The move count as MSMQ counts it (SPEC section 3): one when a message goes to a retry subqueue or
# the poison queue, one when it comes back from a retry subqueue for its retry. A row stores the
# moves made so far; a retry subqueue's message comes back when its cycle takes it, so its handler
# reads one more than its row, and the handler of retry cycle k reads 2k, from which WCF derives k.
def moves_back(table: str) -> int:
    """The move a cycle of `table` makes when it takes a message: one back to the application
    queue from a retry subqueue; none from the inbound or the poison queue, read in place."""
    return 1 if table.startswith("retry_") else 0


def entering_move_count(table: str) -> int | None:
    """The move count of a message entering `table`, when the table alone decides it: 2k - 1 in
    retry subqueue k (k moves there, k - 1 back), however the message came, so that every handler
    of cycle k reads 2k. None elsewhere: entering the poison queue adds one to the message's count."""
    return 2 * cycle_of(table) - 1 if table.startswith("retry_") else None


def _final(handling: ReceiveErrorHandling, expired: bool) -> Route:
    if handling is ReceiveErrorHandling.FAULT:
        return Route(STAY, Disposition.FAULTED, "faulted")
    if handling is ReceiveErrorHandling.DROP:
        # WCF: a dropped message appears in the dead-letter queue only if its time to live expired.
        if expired:
            return Route(DEAD_LETTER, Disposition.EXPIRED, "expired")
        return Route(PROCESSED, Disposition.DROPPED, "dropped")
    if handling is ReceiveErrorHandling.REJECT:
        return Route(DEAD_LETTER, Disposition.REJECTED, "rejected")
    return Route(POISON, Disposition.POISONED, "poisoned")


PROCESSED_ROUTE = Route(PROCESSED, Disposition.PROCESSED)
CONVERSATION_ENDED = Route(DEAD_LETTER, Disposition.ENDED, "conversation_ended")
OUTAGE = Route(STAY, Disposition.OUTAGE, "outage")


def route_main(table: str, outcome: Outcome, policy: Policy, expired: bool, conversation: bool = False) -> Route:
    """Route a message after its cycle in the inbound queue or a retry subqueue; `conversation`
    says whether it belongs to one."""
    if outcome is Outcome.SUCCEEDED:
        return PROCESSED_ROUTE
    if outcome is Outcome.UNRECOVERABLE:
        if policy.unrecoverable.route is UnrecoverableRoute.QUARANTINE:
            return Route(QUARANTINE, Disposition.QUARANTINED, "unrecoverable")
    elif cycle_of(table) < policy.max_retry_cycles:
        return Route(retry_table(cycle_of(table) + 1), Disposition.MOVED, "retry")
    if conversation and policy.on_conversation_poison is OnConversationPoison.END_CONVERSATION:
        return CONVERSATION_ENDED
    return _final(policy.receive_error_handling, expired)


def route_held(head: Route) -> Route:
    """A message not attempted because an earlier message of its conversation failed in this
    cycle: it goes wherever that message goes, so the conversation stays together and in order."""
    if head.disposition is Disposition.ENDED:
        return head
    return Route(head.destination, head.disposition, "held")


def route_joined(table: str, waiting: list[str], current: str) -> Route:
    """A message whose conversation has an earlier message waiting in `table`: it joins it there
    when that is further down the flow, and otherwise waits where it is (a message never moves
    back upstream, which would give it more attempts than the policy allows)."""
    if waiting.index(table) > waiting.index(current):
        return Route(table, Disposition.MOVED, "held")
    return Route(STAY, Disposition.HELD, "held")


def route_poison(outcome: Outcome, poison: PoisonQueuePolicy, expired: bool) -> Route:
    """Route a message after its cycle in the poison queue (no handler: quarantine it)."""
    if poison.handler is None:
        return Route(QUARANTINE, Disposition.QUARANTINED, "poison")
    if outcome is Outcome.SUCCEEDED:
        return Route(PROCESSED, Disposition.PROCESSED)
    return _final(poison.receive_error_handling, expired)


def route_before_delivery(expired: bool, duplicate: bool, ended: bool = False) -> Route | None:
    """Messages that are never delivered: already-processed duplicates, messages of an ended
    conversation, and expired ones."""
    if duplicate:
        return Route(PROCESSED, Disposition.DUPLICATE, "duplicate")
    if ended:
        return CONVERSATION_ENDED
    if expired:
        return Route(DEAD_LETTER, Disposition.EXPIRED, "expired")
    return None
