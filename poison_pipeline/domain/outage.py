"""Outage detection: Service Broker's automatic queue disabling, as a circuit breaker (SPEC 5)."""

from __future__ import annotations


class OutageDetector:
    """Counts messages in a row whose every attempt failed with a recoverable error.

    Messages that failed unrecoverably say something about themselves, not about a dependency,
    so they neither count nor break the run; any success does.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.streak = 0

    def succeeded(self) -> None:
        self.streak = 0

    def failed(self) -> bool:
        """Count one failed message; True when the run reaches the threshold (0 never trips)."""
        self.streak += 1
        return 0 < self.threshold <= self.streak
