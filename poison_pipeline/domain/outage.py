"""Outage detection: Service Broker's automatic queue disabling, as a circuit breaker (SPEC 5)."""

from __future__ import annotations


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
