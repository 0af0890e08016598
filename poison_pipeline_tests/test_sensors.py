"""Sensors: one test per cursor state, asserting the run requests and the cursor (SPEC section 9)."""

from __future__ import annotations

import json

from dagster import DagsterInstance, SensorResult, build_sensor_context

from poison_pipeline.defs.sensors import waiting_sensor
from poison_pipeline.engine.cycle import run_cycle
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import queue, send


def evaluate(declaration, table: str, cursor: str | None) -> SensorResult:
    sensor = waiting_sensor(declaration, "q", table)
    with DagsterInstance.ephemeral() as instance:
        result = sensor(build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, SensorResult)
    return result


def test_no_tables_yet_skips_without_a_cursor_state(make_declaration):
    result = evaluate(make_declaration(queue()), "inbound", None)
    assert not result.run_requests and "does not exist" in result.skip_reason.skip_message


def test_first_evaluation_with_arrivals_requests_a_run(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}, "b": {}})
    result = evaluate(declaration, "inbound", None)
    [request] = result.run_requests
    assert request.run_key.startswith("q/inbound/v1/")
    assert request.tags["poison_pipeline/queue"] == "q"
    cursor = json.loads(result.cursor)
    assert cursor["last_run_key"] == request.run_key and cursor["due"] == 2 and cursor["waiting"] == 2


def test_same_state_again_requests_nothing(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    first = evaluate(declaration, "inbound", None)
    second = evaluate(declaration, "inbound", first.cursor)
    assert not second.run_requests and "already requested" in second.skip_reason.skip_message
    assert json.loads(second.cursor) == json.loads(first.cursor)


def test_new_arrivals_after_a_request_request_again(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    first = evaluate(declaration, "inbound", None)
    send(declaration, {"b": {}})
    second = evaluate(declaration, "inbound", first.cursor)
    [request] = second.run_requests
    assert request.run_key != first.run_requests[0].run_key
    assert json.loads(second.cursor)["waiting"] == 2


def test_empty_table_after_a_cycle_skips_and_keeps_the_last_key(spark, make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    first = evaluate(declaration, "inbound", None)
    run_cycle(spark, declaration, "q", "inbound")
    second = evaluate(declaration, "inbound", first.cursor)
    assert not second.run_requests
    cursor = json.loads(second.cursor)
    assert cursor["waiting"] == 0 and cursor["last_run_key"] == first.run_requests[0].run_key


def test_retry_subqueue_waits_until_due(spark, make_declaration):
    declaration = make_declaration(queue(retry_cycle_delay="1h", receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    result = evaluate(declaration, "retry_1", None)
    assert not result.run_requests and "none due; next due at" in result.skip_reason.skip_message
    cursor = json.loads(result.cursor)
    assert cursor["waiting"] == 1 and cursor["due"] == 0 and cursor["next_due"]


def test_retry_subqueue_requests_once_due(spark, make_declaration):
    declaration = make_declaration(queue(retry_cycle_delay=0, receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    [request] = evaluate(declaration, "retry_1", None).run_requests
    assert request.run_key.startswith("q/retry_1/")


def test_disabled_queue_requests_nothing_and_says_why(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    set_enabled(QueueTables.of(declaration, "q"), False, "operator", "maintenance window")
    result = evaluate(declaration, "inbound", None)
    assert not result.run_requests and "maintenance window" in result.skip_reason.skip_message


def test_unreadable_cursor_counts_as_first_evaluation(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    result = evaluate(declaration, "inbound", "{not json")
    assert len(result.run_requests) == 1
