"""Outage detection: Service Broker's automatic queue disabling, as a circuit breaker (SPEC 5)."""

from __future__ import annotations

from poison_pipeline.domain.policy import OutageRecovery, Policy


class OutageDetector:
    """Counts messages in a row whose attempts failed with an error that points at a dependency
    (policy outage_errors).

    A message counts once however many attempts it made: one message whose own content makes it
    fail that way (an unreachable address in its body) must not disable the queue on its own.
    Any success resets the run: it proves the dependency answers. Other failures say something
    about their message, not about a dependency, so they neither count nor reset it.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.streak = 0

    def succeeded(self) -> None:
        self.streak = 0

    def failed(self) -> bool:
        """Count one more message; True once the run reaches the threshold (0: never)."""
        self.streak += 1
        return 0 < self.threshold <= self.streak


# How the reason of a queue an outage disabled begins (engine/commit.py writes it).
OUTAGE_SUSPECTED = "outage suspected"


def probed(policy: Policy, enabled: bool, reason: str | None) -> bool:
    """Whether a queue in this state is probed: disabled by an outage (not by an operator, nor by a
    message that faulted), under a policy that says `outage_recovery: probe`."""
    return (not enabled and policy.outage_recovery is OutageRecovery.PROBE
            and (reason or "").startswith(OUTAGE_SUSPECTED))
