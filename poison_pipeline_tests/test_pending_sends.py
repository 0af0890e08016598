"""Ending a conversation deletes the messages still waiting to be sent on it (Service Broker deletes
them from sys.transmission_queue), recorded in the sender's dead_letter so it sees what was not sent."""

from __future__ import annotations

from poison_pipeline.broker.conversations import CONVERSATION_ENDED, end_conversation
from poison_pipeline.broker.transmission import transmit
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import rows
from poison_pipeline_tests.test_sending import declare, order

SHIP = [{"to": "shipping", "type": "ship", "body": {"n": 1}}, {"to": "shipping", "type": "ship", "body": {"n": 2}}]


def waiting_sends(spark, declaration) -> None:
    """Orders sends two messages on c1 and one on c2 while shipping is down: they wait in transmission."""
    set_enabled(QueueTables.of(declaration, "shipping"), False, "ops", "maintenance")
    order(declaration, "o1", "c1", SHIP)
    order(declaration, "o2", "c2", SHIP[:1])
    run_cycle(spark, declaration, "orders", "inbound")
    assert sorted(r["message_id"] for r in rows(declaration, "transmission", "orders")) == \
        ["orders:o1/1", "orders:o1/2", "orders:o2/1"]


def unsent(declaration, queue: str) -> list[tuple[str, str, str]]:
    return sorted((r["message_id"], r["reason"], r["from_table"]) for r in rows(declaration, "dead_letter", queue))


def delivered_after_enable(declaration) -> list[str]:
    set_enabled(QueueTables.of(declaration, "shipping"), True, "ops", "back")
    transmit(declaration, "orders")
    return sorted(r["message_id"] for r in rows(declaration, "inbound", "shipping"))


def test_the_sender_ending_a_conversation_deletes_its_pending_sends_on_it(spark, make_declaration):
    declaration = declare(make_declaration)
    waiting_sends(spark, declaration)
    result = end_conversation(declaration, "orders", "c1", -8494, "access denied", "alice")
    assert result.unsent == {"orders": 2}
    assert unsent(declaration, "orders") == [("orders:o1/1", CONVERSATION_ENDED, "transmission"),
                                             ("orders:o1/2", CONVERSATION_ENDED, "transmission")]
    assert delivered_after_enable(declaration) == ["orders:o2/1"]  # never delivered after the end


def test_the_target_ending_a_conversation_deletes_the_sends_waiting_for_it_and_tells_the_sender(
        spark, make_declaration):
    declaration = declare(make_declaration)
    waiting_sends(spark, declaration)
    result = end_conversation(declaration, "shipping", "c1", 42, "order cancelled", "bob")
    assert result.unsent == {"orders": 2} and result.notified == ("orders",)
    assert unsent(declaration, "orders") == [("orders:o1/1", CONVERSATION_ENDED, "transmission"),
                                             ("orders:o1/2", CONVERSATION_ENDED, "transmission")]
    [note] = rows(declaration, "notifications", "shipping")
    assert (note["recipient"], note["conversation_id"], note["code"]) == ("orders", "c1", 42)
    assert delivered_after_enable(declaration) == ["orders:o2/1"]
    # Running it again deletes nothing more and tells nobody twice.
    again = end_conversation(declaration, "shipping", "c1", 42, "order cancelled", "bob")
    assert again.unsent == {} and again.notified == ()
    assert len(rows(declaration, "dead_letter", "orders")) == 2


def test_a_message_sent_on_a_conversation_after_it_ended_is_not_sent(spark, make_declaration):
    declaration = declare(make_declaration)
    end_conversation(declaration, "orders", "c1", 42, "customer closed the account", "alice")
    late = {"message_id": "o3", "message_type": "order", "conversation_id": "c3",
            "body": {"sends": SHIP[:1], "conversation": "c1"}}  # its handler sends on the ended one anyway
    assert not enqueue(declaration, "orders", [late]).refused
    order(declaration, "o4", "c4", SHIP[:1])
    report = run_cycle(spark, declaration, "orders", "inbound")
    assert report.counts["transmitted"] == 1
    assert sorted(r["message_id"] for r in rows(declaration, "inbound", "shipping")) == ["orders:o4/1"]
    assert ("orders:o3/1", CONVERSATION_ENDED, "transmission") in unsent(declaration, "orders")
