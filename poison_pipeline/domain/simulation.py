"""Policy simulation: what a candidate policy would have done with the attempts a queue recorded.

A message's recorded attempts in the application queue (inbound and retry subqueues), in order, are
replayed under the candidate's rules (SPEC section 6, with the candidate's back-off and retry rules):
its counts decide where the message goes after each attempt. What cannot be known is filled by two
stated assumptions (`ASSUMPTIONS`): the n-th attempt ends as the recorded n-th attempt did, whenever
the candidate makes it; and an attempt that never happened ends as the message's last recorded
attempt did (for a message whose journey ended: one still waiting has not had it yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from poison_pipeline.domain.policy import Policy
from poison_pipeline.domain.routing import INBOUND, Disposition, Outcome, retry_table, route_main

__all__ = ["ASSUMPTIONS", "Fate", "Fates", "Tried", "replay"]

ASSUMPTIONS = (
    "the n-th attempt of a message ends as its recorded n-th attempt did, whenever the candidate policy makes it",
    "an attempt the candidate makes that never happened ends as the message's last recorded attempt did; "
    "a message still waiting for its next cycle has not had it yet, and stays waiting",
    "time is the delays between retry cycles and the handler's recorded time; "
    "the wait for a cycle's turn (sensor interval, batch) is not counted",
    "each message is replayed alone: expiry, ordering, outages and redrives are not simulated",
)


class Fates(StrEnum):
    """Where a message's journey through the application queue ends."""

    PROCESSED = "processed"
    DROPPED = "dropped"
    POISONED = "poisoned"
    DEAD_LETTERED = "dead_lettered"
    QUARANTINED = "quarantined"
    FAULTED = "faulted"
    WAITING = "waiting"


_BY_DISPOSITION = {
    Disposition.PROCESSED: Fates.PROCESSED,
    Disposition.DROPPED: Fates.DROPPED,
    Disposition.POISONED: Fates.POISONED,
    Disposition.REJECTED: Fates.DEAD_LETTERED,
    Disposition.EXPIRED: Fates.DEAD_LETTERED,
    Disposition.ENDED: Fates.DEAD_LETTERED,
    Disposition.QUARANTINED: Fates.QUARANTINED,
    Disposition.FAULTED: Fates.FAULTED,
}


@dataclass(frozen=True)
class Tried:
    """One recorded attempt: whether it failed, and how (a rule or `unrecoverable` matches
    `error_type` and `error_code`); `rule` and `unrecoverable` say what matched under the policy."""

    failed: bool
    seconds: float
    rule: int | None = None
    unrecoverable: bool = False


@dataclass(frozen=True)
class Fate:
    outcome: Fates
    attempts: int
    seconds: float
    # Attempts the candidate made that never happened (filled by the second assumption).
    assumed: int = 0


def replay(policy: Policy, message_id: str, tried: Sequence[Tried], *, finished: bool) -> Fate:
    """The fate of a message under `policy`, given its recorded attempts in order (`tried`, at least
    one) and whether its recorded journey had `finished` (else it still waits for a cycle)."""
    seconds = 0.0
    made = 0
    cycle = 0
    table = INBOUND
    while True:
        in_cycle = 0
        while True:
            if made >= len(tried) and not finished:
                return Fate(Fates.WAITING, made, seconds, max(made - len(tried), 0))
            attempt = tried[min(made, len(tried) - 1)]
            made += 1
            in_cycle += 1
            seconds += attempt.seconds
            if not attempt.failed:
                return Fate(Fates.PROCESSED, made, seconds, max(made - len(tried), 0))
            under = policy.under(attempt.rule)
            if attempt.unrecoverable:
                route = route_main(table, Outcome.UNRECOVERABLE, policy, expired=False)
                break
            if in_cycle >= under.receive_retry_count + 1:
                route = route_main(table, Outcome.EXHAUSTED, under, expired=False)
                break
        if route.disposition is not Disposition.MOVED:
            return Fate(_BY_DISPOSITION[route.disposition], made, seconds, max(made - len(tried), 0))
        cycle += 1
        table = retry_table(cycle)
        seconds += under.delay_before(cycle, message_id).total_seconds()
