"""The transmission sensor: one test per state, asserting run requests and cursor (SPEC sections 7, 9)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from dagster import DagsterInstance, SensorResult, build_sensor_context

from poison_pipeline.defs.sensors import decide_transmission, transmission_sensor
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import TRANSMISSION, QueueTables
from poison_pipeline_tests.support import seed

NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)
ACCEPT = "poison_pipeline_tests.handlers:accept"


def declare(make_declaration):
    return make_declaration({"orders": {"handler": ACCEPT, "sends_to": ["shipping"]}, "shipping": {"handler": ACCEPT}})


def pending(declaration, deadline: datetime | None) -> None:
    tables = QueueTables.of(declaration, "orders")
    tables.ensure()
    row = {"target_queue": "shipping", "message_id": "o1/1", "conversation_id": "c1", "sequence_number": 1,
           "message_type": "ship", "body": b"{}", "encoding": "json", "enqueued_at": NOW, "sender": "orders",
           "headers": [], "source_message_id": "o1", "deadline": deadline, "original_conversation_id": "c1",
           "resend_count": 0, "batch_id": "tx-inbound-1"}
    seed(tables, TRANSMISSION, pa.Table.from_pylist([row], schema=schemas.TRANSMISSION))


def evaluate(declaration, cursor: str | None) -> SensorResult:
    with DagsterInstance.ephemeral() as instance:
        result = transmission_sensor(declaration, "orders")(build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, SensorResult)
    return result


def test_nothing_sent_yet_skips(make_declaration):
    result = evaluate(declare(make_declaration), None)
    assert not result.run_requests and "sent nothing" in result.skip_reason.skip_message


def test_pending_messages_request_one_offer_and_not_again(make_declaration):
    declaration = declare(make_declaration)
    pending(declaration, None)
    first = evaluate(declaration, None)
    [request] = first.run_requests
    assert request.run_key.startswith("orders/transmission/v1/") and request.tags["poison_pipeline/queue"] == "orders"
    assert json.loads(first.cursor)["pending"] == 1
    again = evaluate(declaration, first.cursor)
    assert not again.run_requests and "already requested" in again.skip_reason.skip_message


def test_a_target_changing_state_requests_a_new_offer(make_declaration):
    declaration = declare(make_declaration)
    pending(declaration, None)
    first = evaluate(declaration, None)
    set_enabled(QueueTables.of(declaration, "shipping"), False, "ops", "down")
    second = evaluate(declaration, first.cursor)
    [request] = second.run_requests
    assert request.run_key != first.run_requests[0].run_key


def test_a_lifetime_running_out_requests_a_new_offer(make_declaration):
    declaration = declare(make_declaration)
    pending(declaration, NOW + timedelta(minutes=5))
    first = decide_transmission(declaration, "orders", {}, NOW)
    assert first.run_key is not None
    assert decide_transmission(declaration, "orders", first.cursor, NOW + timedelta(minutes=4)).run_key is None
    later = decide_transmission(declaration, "orders", first.cursor, NOW + timedelta(minutes=6))
    assert later.run_key not in (None, first.run_key)


def test_sends_to_draws_lineage_into_the_target_inbound(make_declaration):
    from dagster import AssetKey

    from poison_pipeline.defs.build import build_definitions

    graph = build_definitions(declare(make_declaration)).resolve_asset_graph()
    assert AssetKey(["orders", "transmission"]) in graph.get(AssetKey(["shipping", "inbound"])).parent_keys
