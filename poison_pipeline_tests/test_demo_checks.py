"""The demo's checking functions, fed passing and failing cases (no Spark)."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from poison_pipeline.examples.checks import (
    Checks,
    came_out_of_order,
    counts_differ,
    handled_out_of_order,
    hook_calls,
    resent_from,
    wrongly_charged,
)
from poison_pipeline.examples.generate import account_messages
from poison_pipeline.operations.conservation import Conservation

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _msg(message_id: str, conversation: str, sequence: int) -> dict:
    return {"message_id": message_id, "conversation_id": conversation, "sequence_number": sequence}


def test_a_failed_claim_prints_mismatch_and_is_remembered() -> None:
    said: list[str] = []
    checks = Checks(said.append)
    assert checks.equal("twenty resent", 20, 20)
    assert not checks.equal("  hook ran once", {"c": 1}, {})
    assert not checks.claim("most first", False, "235 of 500")
    assert said == ["twenty resent  OK", "  hook ran once  MISMATCH: expected {'c': 1}, found {}",
                    "most first  MISMATCH: 235 of 500"]
    assert checks.made == 3
    assert checks.failed == ["hook ran once", "most first"]
    assert not checks.passed


def test_counts_differ_names_each_difference() -> None:
    assert counts_differ(Counter(a=1), Counter(a=1)) == ""
    assert counts_differ(Counter(a=1), Counter()) == "a: 0 (expected 1)"
    assert counts_differ(Counter(a=1), Counter(a=2, b=1)) == "a: 2 (expected 1); b: 1 (expected 0)"


def test_came_out_of_order_counts_conversations_whose_later_message_came_first() -> None:
    records = [_msg("a2", "a", 2), _msg("b1", "b", 1), _msg("a1", "a", 1), _msg("b2", "b", 2), {"message_id": "x"}]
    assert came_out_of_order(records) == {"a"}


def test_most_demo_orders_come_before_their_profile() -> None:
    records = account_messages(500, random.Random(11))
    early = came_out_of_order(records)
    assert len(early) * 2 > 500
    # With no order drawn first, none comes first: the claim "most" would fail.
    assert len(came_out_of_order(account_messages(500, random.Random(11), orders_first=0.0))) == 0
    assert sorted(r["message_id"] for r in records) == sorted(f"acc-{u:05d}-{s}" for u in range(500) for s in (1, 2))


def test_handled_out_of_order_reads_first_attempts() -> None:
    records = [_msg("a1", "a", 1), _msg("a2", "a", 2), _msg("b1", "b", 1), _msg("b2", "b", 2), _msg("c1", "c", 1)]
    at = [T0 + timedelta(milliseconds=n) for n in range(6)]
    in_order = [{"message_id": "a1", "started_at": at[0]}, {"message_id": "a2", "started_at": at[1]},
                {"message_id": "b1", "started_at": at[2]}, {"message_id": "b2", "started_at": at[3]},
                {"message_id": "b2", "started_at": at[4]}]  # a retry of b2 later changes nothing
    assert handled_out_of_order(in_order, records) == set()
    swapped = [{"message_id": "a2", "started_at": at[0]}, {"message_id": "a1", "started_at": at[1]},
               {"message_id": "a2", "started_at": at[2]}, {"message_id": "b1", "started_at": at[3]}]
    assert handled_out_of_order(swapped, records) == {"a"}
    # The order attempted and the profile never: out of order. The tail never attempted: in order.
    skipped = [{"message_id": "a2", "started_at": at[0]}, {"message_id": "b1", "started_at": at[1]}]
    assert handled_out_of_order(skipped, records) == {"a"}


def test_hook_calls_counts_lines_per_conversation(tmp_path: Path) -> None:
    log = tmp_path / "hook.log"
    assert hook_calls(log) == Counter()
    odd = "../presentation/003\nwith a newline"
    log.write_text("".join(json.dumps({"conversation_id": c}) + "\n" for c in ("p-1", odd, "p-1")))
    assert hook_calls(log) == Counter({"p-1": 2, odd: 1})
    assert counts_differ(Counter({"p-1": 1, odd: 1}), hook_calls(log)) == "p-1: 2 (expected 1)"


def test_wrongly_charged_finds_outage_attempts_counted_as_aborts() -> None:
    attempts = [{"message_id": "m1", "outcome": "outage"}, {"message_id": "m1", "outcome": "success"},
                {"message_id": "m2", "outcome": "outage"}, {"message_id": "m2", "outcome": "abort"},
                {"message_id": "m2", "outcome": "success"}]
    good = [{"message_id": "m1", "total_abort_count": 0}, {"message_id": "m2", "total_abort_count": 1}]
    assert wrongly_charged(good, attempts) == []
    charged = [{"message_id": "m1", "total_abort_count": 1}, {"message_id": "m2", "total_abort_count": 2}]
    assert wrongly_charged(charged, attempts) == ["m1", "m2"]


def test_the_conservation_line_shows_every_ledger_term_and_its_verdict() -> None:
    balance = Conservation("q", waiting=1, poison=0, dead_letter=2, quarantined=0,
                           ledger={"processed": 5, "ended": 3})
    assert balance.accounted == 11
    assert balance.line(received=11) == (
        "q: in 11 = 5 processed + 0 dropped + 0 duplicate + 3 ended + 1 waiting + 0 poison + 2 dead-letter"
        " + 0 quarantined + 0 archived + 0 purged (= 11)  OK")
    assert balance.line(received=12).endswith("(= 11)  MISMATCH")


def test_resent_from_names_the_original_conversation_of_a_resend_only() -> None:
    assert resent_from("resend:1:shipment-7") == "shipment-7"
    assert resent_from("shipment-7~resend-1") == "shipment-7"  # as an earlier version spelled it
    assert resent_from("shipment-7~resend-12") == "shipment-7"
    assert resent_from("shipment-7") is None
    assert resent_from("shipment-7~resend-0") is None
    assert resent_from(None) is None
