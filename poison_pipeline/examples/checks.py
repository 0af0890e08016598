"""The demo's checks: each claim the demo makes is printed with OK or MISMATCH and what was found,
and the pure functions here count, from rows read out of the Delta tables (or the application's own
records), what each claim is about."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from poison_pipeline.domain.names import ResendName


class Checks:
    """The claims of one scenario: print each with its verdict, remember the ones that failed."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.say = say
        self.made = 0
        self.failed: list[str] = []

    @property
    def passed(self) -> bool:
        return not self.failed

    def claim(self, text: str, passed: bool, found: str = "") -> bool:
        """Print `text` with OK, or with MISMATCH and what was found instead."""
        self.made += 1
        self.say(f"{text}  OK" if passed else f"{text}  MISMATCH" + (f": {found}" if found else ""))
        if not passed:
            self.failed.append(text.strip())
        return passed

    def equal(self, text: str, expected: Any, found: Any) -> bool:
        return self.claim(text, expected == found, f"expected {_shown(expected)}, found {_shown(found)}")


def _shown(value: Any, limit: int = 200) -> str:
    if isinstance(value, (set, frozenset)):
        value = sorted(value)
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def counts_differ(expected: Mapping[str, int], found: Mapping[str, int]) -> str:
    """'' when both count the same keys alike; else what differs, key by key."""
    keys = sorted(set(expected) | set(found))
    wrong = [f"{k}: {found.get(k, 0)} (expected {expected.get(k, 0)})" for k in keys
             if expected.get(k, 0) != found.get(k, 0)]
    return "; ".join(wrong)


def came_out_of_order(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """Conversations of which a message came (in this list's order) before one with a lower
    sequence number."""
    highest: dict[str, int] = {}
    late: set[str] = set()
    for record in records:
        conversation, sequence = record.get("conversation_id"), record.get("sequence_number")
        if conversation is None or sequence is None:
            continue
        if sequence < highest.get(conversation, sequence):
            late.add(conversation)
        highest[conversation] = max(sequence, highest.get(conversation, sequence))
    return late


def handled_out_of_order(attempts: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> set[str]:
    """Conversations whose messages were not first attempted in sequence order: `attempts` are rows of
    the attempts table (message_id, started_at), `records` the messages sent (message_id,
    conversation_id, sequence_number). A message attempted while one before it in its conversation
    never was, or was only later, is out of order; messages never attempted after the last one that
    was (a conversation ended early) are not."""
    of = {r["message_id"]: (r["conversation_id"], r["sequence_number"]) for r in records
          if r.get("conversation_id") is not None and r.get("sequence_number") is not None}
    first: dict[str, Any] = {}
    for attempt in attempts:
        message = attempt["message_id"]
        if message in of and (message not in first or attempt["started_at"] < first[message]):
            first[message] = attempt["started_at"]
    by_conversation: dict[str, list[tuple[int, Any]]] = {}
    for message, (conversation, sequence) in of.items():
        by_conversation.setdefault(conversation, []).append((sequence, first.get(message)))
    jumbled = set()
    for conversation, messages in by_conversation.items():
        latest, gap = None, False
        for _, started in sorted(messages, key=lambda m: m[0]):
            if started is None:
                gap = True
                continue
            if gap or (latest is not None and started < latest):
                jumbled.add(conversation)
                break
            latest = started
    return jumbled


def hook_calls(log: Path) -> Counter[str]:
    """How many times the clean-up hook ran per conversation, from its log (one JSON line a call)."""
    if not log.exists():
        return Counter()
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Counter(json.loads(line)["conversation_id"] for line in lines)


def wrongly_charged(messages: Iterable[Mapping[str, Any]], attempts: Iterable[Mapping[str, Any]]) -> list[str]:
    """Messages whose total_abort_count is not the number of their failed attempts that were not
    outage attempts: an attempt made during an outage must be charged to no message."""
    failed = Counter(a["message_id"] for a in attempts if a["outcome"] not in ("success", "outage"))
    return sorted(m["message_id"] for m in messages if m["total_abort_count"] != failed.get(m["message_id"], 0))


def resent_from(conversation_id: str | None) -> str | None:
    """The original conversation of a resend conversation (domain/names.py); None for any other."""
    resend = ResendName.parse(conversation_id)
    return None if resend is None else resend.original
