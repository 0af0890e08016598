"""Outage detection: Service Broker's automatic queue disabling, as a circuit breaker (SPEC 5)."""

from __future__ import annotations


class OutageDetector:
    """Counts failed attempts in a row whose error points at a dependency (policy outage_errors).

    Any success resets the run: it proves the dependency answers. Other failures say something
    about their message, not about a dependency, so they neither count nor reset it.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.streak = 0

    def succeeded(self) -> None:
        self.streak = 0

    def failed(self, attempts: int) -> bool:
        """Count `attempts` more outage failures; True once the run reaches the threshold (0: never)."""
        self.streak += attempts
        return 0 < self.threshold <= self.streak
