"""Sending between queues: the outbox, the transmission queue, conversation errors and resending
(SPEC section 7), with real Spark cycles and Delta tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from poison_pipeline.broker.conversations import ended_conversations
from poison_pipeline.broker.transmission import transmit
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import rows

FORWARD = "poison_pipeline_tests.handlers:forwarding"
ACCEPT = "poison_pipeline_tests.handlers:accept"
FAST = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0, "receive_error_handling": "drop"}


def declare(make_declaration, **target: Any) -> Any:
    return make_declaration({
        "orders": {"handler": FORWARD, "policy": FAST},
        "shipping": {"handler": ACCEPT, "policy": FAST, **target},
    })


def order(declaration, message_id: str, conversation: str, sends: list[dict], **body: Any) -> None:
    record = {"message_id": message_id, "message_type": "order", "conversation_id": conversation,
              "body": {"sends": sends, **body}}
    assert not enqueue(declaration, "orders", [record]).refused


def test_sent_messages_reach_the_target_only_when_the_attempt_succeeds(spark, make_declaration):
    declaration = declare(make_declaration)
    order(declaration, "o1", "c1", [{"to": "shipping", "type": "ship", "body": {"n": 1}},
                                    {"to": "shipping", "type": "ping"}])
    order(declaration, "o2", "c2", [{"to": "shipping", "type": "ship", "body": {"n": 2}}], fail=True)
    report = run_cycle(spark, declaration, "orders", "inbound")
    assert report.counts["transmitted"] == 2
    inbound = sorted(rows(declaration, "inbound", "shipping"), key=lambda r: r["message_id"])
    # o2's attempt failed: what it sent was never released.
    assert [(r["message_id"], r["message_type"], r["conversation_id"], r["sender"], r["encoding"])
            for r in inbound] == [("orders:o1/1", "ship", "c1", "orders", "json"),
                                  ("orders:o1/2", "ping", "c1", "orders", "empty")]
    assert rows(declaration, "transmission", "orders") == []
    assert run_cycle(spark, declaration, "shipping", "inbound").counts["processed"] == 2


def test_a_disabled_target_keeps_messages_waiting_in_the_transmission_queue(spark, make_declaration):
    declaration = declare(make_declaration)
    set_enabled(QueueTables.of(declaration, "shipping"), False, "ops", "maintenance")
    order(declaration, "o1", "c1", [{"to": "shipping", "type": "ship", "body": {"n": 1}}])
    run_cycle(spark, declaration, "orders", "inbound")
    assert [r["message_id"] for r in rows(declaration, "transmission", "orders")] == ["orders:o1/1"]
    assert not QueueTables.of(declaration, "shipping").exists("inbound") or not rows(declaration, "inbound", "shipping")
    set_enabled(QueueTables.of(declaration, "shipping"), True, "ops", "back")
    result = transmit(declaration, "orders")
    assert result.delivered == {"shipping": 1}
    assert [r["message_id"] for r in rows(declaration, "inbound", "shipping")] == ["orders:o1/1"]
    # Running it again delivers nothing twice.
    assert transmit(declaration, "orders").delivered == {}
    assert len(rows(declaration, "inbound", "shipping")) == 1


def test_a_contract_breach_is_dead_lettered_not_resent_and_ends_the_conversation(spark, make_declaration):
    declaration = declare(make_declaration, message_types=["ship"])
    order(declaration, "o1", "c1", [{"to": "shipping", "type": "ship", "body": {"n": 1}},
                                    {"to": "shipping", "type": "refund", "body": {"n": 2}}])
    report = run_cycle(spark, declaration, "orders", "inbound")
    assert report.counts["conversation_errors"] == 1
    dead = rows(declaration, "dead_letter", "orders")
    assert sorted((r["message_id"], r["reason"], r["from_table"]) for r in dead) == [
        ("orders:o1/1", "conversation_error -8428", "transmission"),
        ("orders:o1/2", "conversation_error -8428", "transmission")]
    notes = [r for r in rows(declaration, "notifications", "orders") if r["kind"] == "conversation_error"]
    assert [(n["conversation_id"], n["code"]) for n in notes][:1] == [("c1", -8428)]
    assert "refund" in notes[0]["description"]
    assert ended_conversations(declaration, "orders")["c1"][0] == -8428
    assert rows(declaration, "transmission", "orders") == []
    assert not QueueTables.of(declaration, "shipping").exists("inbound") or not rows(declaration, "inbound", "shipping")


def test_a_lifetime_expired_conversation_is_resent_in_order_on_a_new_one(spark, make_declaration):
    declaration = declare(make_declaration)
    shipping = QueueTables.of(declaration, "shipping")
    set_enabled(shipping, False, "ops", "down")
    sends = [{"to": "shipping", "type": "begin"}, {"to": "shipping", "type": "item", "body": {"sku": 7}},
             {"to": "shipping", "type": "end"}]
    order(declaration, "o1", "c1", sends, lifetime_s=60)
    run_cycle(spark, declaration, "orders", "inbound")
    later = datetime.now(UTC) + timedelta(minutes=2)
    result = transmit(declaration, "orders", now=later)
    assert [(f.code, f.action, f.new_conversation_id) for f in result.failures] == [(-8489, "resent", "resend:1:c1")]
    pending = sorted(rows(declaration, "transmission", "orders"), key=lambda r: r["sequence_number"])
    # Same ids, same types (the bodyless ones too), same order, on the new conversation.
    assert [(r["message_id"], r["message_type"], r["conversation_id"], r["sequence_number"], r["resend_count"])
            for r in pending] == [("orders:o1/1", "begin", "resend:1:c1", 1, 1),
                                  ("orders:o1/2", "item", "resend:1:c1", 2, 1),
                                  ("orders:o1/3", "end", "resend:1:c1", 3, 1)]
    assert pending[0]["deadline"] == later + timedelta(seconds=60)
    assert ended_conversations(declaration, "orders")["c1"][0] == -8489
    set_enabled(shipping, True, "ops", "up")
    assert transmit(declaration, "orders", now=later).delivered == {"shipping": 3}
    arrived = sorted(rows(declaration, "inbound", "shipping"), key=lambda r: r["sequence_number"])
    assert [(r["message_id"], r["conversation_id"]) for r in arrived] == [
        ("orders:o1/1", "resend:1:c1"), ("orders:o1/2", "resend:1:c1"), ("orders:o1/3", "resend:1:c1")]


def test_a_resend_that_duplicates_is_dropped_by_the_receiver(spark, make_declaration):
    declaration = declare(make_declaration)
    order(declaration, "o1", "c1", [{"to": "shipping", "type": "ship", "body": {"n": 1}}])
    run_cycle(spark, declaration, "orders", "inbound")
    run_cycle(spark, declaration, "shipping", "inbound")
    # The same message arrives again (a resend after an error whose first copy had got through).
    again = [{"message_id": "orders:o1/1", "message_type": "ship", "conversation_id": "resend:1:c1", "body": {"n": 1}}]
    assert not enqueue(declaration, "shipping", again).refused
    report = run_cycle(spark, declaration, "shipping", "inbound")
    assert report.counts.get("duplicate") == 1 and not report.counts.get("processed")


def test_an_undeclared_target_follows_the_undefined_error_configuration(spark, make_declaration):
    declaration = make_declaration({
        "orders": {"handler": FORWARD, "policy": {**FAST, "on_undefined_error": "dead_letter"}},
    })
    order(declaration, "o1", "c1", [{"to": "billing", "type": "bill", "body": {"n": 1}}])
    report = run_cycle(spark, declaration, "orders", "inbound")
    assert report.counts["conversation_errors"] == 1
    assert [(r["message_id"], r["reason"]) for r in rows(declaration, "dead_letter", "orders")] == [
        ("orders:o1/1", "conversation_error -8470")]


def test_a_target_altered_after_sending_fails_the_conversation_and_a_resend_uses_its_new_contract(
        spark, make_declaration):
    sent_under = declare(make_declaration, message_types=["ship"])
    set_enabled(QueueTables.of(sent_under, "shipping"), False, "ops", "down")
    order(sent_under, "o1", "c1", [{"to": "shipping", "type": "ship", "body": {"n": 1}}])
    run_cycle(spark, sent_under, "orders", "inbound")
    # The same lake, declared again: shipping now accepts refunds too, and orders resends.
    altered = make_declaration({
        "orders": {"handler": FORWARD, "policy": {**FAST, "on_undefined_error": "resend"}},
        "shipping": {"handler": ACCEPT, "policy": FAST, "message_types": ["ship", "refund"]},
    })
    set_enabled(QueueTables.of(altered, "shipping"), True, "ops", "up")
    result = transmit(altered, "orders")
    assert [(f.code, f.action) for f in result.failures] == [(-8469, "resent")]
    # The resent copy was sent under the queue's new contract: the next offer delivers it.
    assert transmit(altered, "orders").delivered == {"shipping": 1}
    [arrived] = rows(altered, "inbound", "shipping")
    assert (arrived["message_id"], arrived["conversation_id"]) == ("orders:o1/1", "resend:1:c1")
