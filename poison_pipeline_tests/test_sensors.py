"""Sensors: one test per cursor state, asserting the run requests and the cursor (SPEC section 9)."""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime, timedelta

from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    EventLogEntry,
    SensorResult,
    build_sensor_context,
    job,
    op,
)

from poison_pipeline.defs.sensors import decide, waiting_sensor
from poison_pipeline.operations.actions import ABANDONED, begin_action, find_action
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import queue_writer
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



def test_an_idle_evaluation_answers_from_its_cursor_without_loading_the_log(make_declaration, monkeypatch):
    """On an object store a load reads the last checkpoint and every commit since; the next log entry
    absent says as much for two requests."""
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    first = evaluate(declaration, "inbound", None)
    real = QueueTables.open

    def no_load(self, table):
        raise AssertionError(f"{table} loaded")

    monkeypatch.setattr(QueueTables, "open", no_load)
    second = evaluate(declaration, "inbound", first.cursor)
    assert not second.run_requests and "already requested" in second.skip_reason.skip_message
    assert json.loads(second.cursor) == json.loads(first.cursor)
    monkeypatch.setattr(QueueTables, "open", real)
    send(declaration, {"b": {}})
    assert len(evaluate(declaration, "inbound", second.cursor).run_requests) == 1


def test_a_queue_disabled_after_a_request_is_seen_at_the_next_evaluation(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    first = evaluate(declaration, "inbound", None)
    set_enabled(QueueTables.of(declaration, "q"), False, "operator", "maintenance window")
    second = evaluate(declaration, "inbound", first.cursor)
    assert not second.run_requests and "maintenance window" in second.skip_reason.skip_message
    set_enabled(QueueTables.of(declaration, "q"), True, "operator", "done")
    third = evaluate(declaration, "inbound", second.cursor)
    # Enabled again, with nothing new: the run requested before still stands (its key is launched once).
    assert not third.run_requests and "already requested" in third.skip_reason.skip_message


def test_a_retry_that_comes_due_without_any_commit_is_requested(spark, make_declaration):
    declaration = make_declaration(queue(retry_cycle_delay="1h", receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    tables, now = QueueTables.of(declaration, "q"), datetime.now(UTC)
    waiting = decide(tables, "retry_1", {}, now)
    assert waiting.run_key is None and waiting.cursor["next_due"]
    assert decide(tables, "retry_1", waiting.cursor, now + timedelta(minutes=59)).run_key is None
    due = decide(tables, "retry_1", waiting.cursor, now + timedelta(hours=2))
    assert due.run_key is not None and due.run_key.startswith("q/retry_1/")


def test_tables_deleted_and_made_again_are_seen_as_changed(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    first = evaluate(declaration, "inbound", None)
    shutil.rmtree(declaration.lake_root)
    send(declaration, {"b": {}})
    again = evaluate(declaration, "inbound", first.cursor)
    [request] = again.run_requests  # the same version as before, of another table
    assert request.run_key != first.run_requests[0].run_key and json.loads(again.cursor)["version"] == 1


def test_a_run_that_ended_badly_is_requested_again_for_the_same_state(make_declaration):
    """A killed or failed cycle leaves its table unchanged: without a new key its messages would
    wait for an unrelated change. A run that succeeded, or has not ended, is not requested again."""
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    sensor = waiting_sensor(declaration, "q", "inbound")
    with DagsterInstance.ephemeral() as instance:

        def step(cursor: str | None) -> SensorResult:
            return sensor(build_sensor_context(instance=instance, cursor=cursor))

        def run_for(result: SensorResult):
            [request] = result.run_requests
            return instance.create_run_for_job(_stand_in, tags={"dagster/run_key": request.run_key})

        first = step(None)
        key = first.run_requests[0].run_key
        instance.report_run_failed(run_for(first))
        second = step(first.cursor)
        assert [r.run_key for r in second.run_requests] == [f"{key}/again-1"]
        pending = run_for(second)
        third = step(second.cursor)
        assert not third.run_requests and "already requested" in third.skip_reason.skip_message
        instance.report_run_canceled(pending)
        fourth = step(third.cursor)
        assert [r.run_key for r in fourth.run_requests] == [f"{key}/again-2"]
        run = run_for(fourth)
        instance.handle_new_event(_success_event(run.run_id, run.job_name))
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.SUCCESS
        assert not step(fourth.cursor).run_requests


@op
def _nothing() -> None:
    pass


@job
def _stand_in() -> None:
    _nothing()


def _success_event(run_id: str, job_name: str) -> EventLogEntry:
    return EventLogEntry(error_info=None, level="INFO", user_message="", run_id=run_id, timestamp=time.time(),
                         dagster_event=DagsterEvent(DagsterEventType.RUN_SUCCESS.value, job_name))


def test_an_interrupted_action_requests_a_cycle_though_nothing_is_due(spark, make_declaration):
    """An operator action a kill left half done is completed by the queue's next cycle: the inbound
    sensor requests that cycle at once, not when the next message arrives, and only once."""
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    run_cycle(spark, declaration, "q", "inbound")
    tables = QueueTables.of(declaration, "q")
    quiet = evaluate(declaration, "inbound", None)
    assert not quiet.run_requests and "none due" in quiet.skip_reason.skip_message
    with queue_writer(tables, "test") as writer:  # killed before its plan: the cycle closes it
        begin_action(writer, "redrive", "dave", {"from": "poison"}, [(tables, "poison")], action_id="half-done")

    result = evaluate(declaration, "inbound", quiet.cursor)
    [request] = result.run_requests
    assert request.run_key.startswith("q/inbound/actions-v")
    again = evaluate(declaration, "inbound", result.cursor)
    assert not again.run_requests and "1 interrupted action(s) of q" in again.skip_reason.skip_message
    assert not evaluate(declaration, "retry_1", None).run_requests  # the inbound's cycle is enough

    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.interrupted.abandoned == ["half-done"]
    assert find_action(tables, "half-done").state == ABANDONED
    after = evaluate(declaration, "inbound", again.cursor)
    assert not after.run_requests and "none due" in after.skip_reason.skip_message
