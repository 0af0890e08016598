"""The notification for disabled queues: sensor evaluations per cursor state and real alert runs
(SPEC sections 8 and 9, Service Broker's BROKER_QUEUE_DISABLED)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterInstance, DefaultSensorStatus, RunRequest, SensorResult, build_sensor_context

from poison_pipeline.defs.alerts import batches, queue_disabled_job, queue_disabled_sensor
from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import alert_job_name, alert_sensor_name, job_name
from poison_pipeline.domain.alerts import MESSAGES_FAILED, QueueEvent
from poison_pipeline.domain.declaration import Declaration, DeclarationError, parse_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import QUEUE_DISABLED, event_row, set_enabled
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline_tests import alert_hooks
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.support import queue, rows, seed, send

QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
RECORD = "poison_pipeline_tests.alert_hooks:record"
BROKEN = "poison_pipeline_tests.alert_hooks:broken"


@pytest.fixture
def declare(tmp_path: Path) -> Callable[..., Declaration]:
    def build(alert_hook: str | None = None, **policy: Any) -> Declaration:
        data: dict[str, Any] = {"lake_root": str(tmp_path / "lake"), "spark": SPARK.model_dump(),
                                "queues": queue(**policy)}
        if alert_hook:
            data["alert_hook"] = alert_hook
        return parse_declaration(data)

    return build


@pytest.fixture(autouse=True)
def _no_recorded_calls() -> Iterator[None]:
    alert_hooks.CALLS.clear()
    yield
    alert_hooks.CALLS.clear()


def evaluate(declaration: Declaration, cursor: str | None) -> SensorResult:
    sensor = queue_disabled_sensor(declaration, "q")
    with DagsterInstance.ephemeral() as instance:
        result = sensor(build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, SensorResult)
    return result


def disabled_events(declaration: Declaration) -> list[dict[str, Any]]:
    return [r for r in rows(declaration, EVENTS) if r["kind"] == QUEUE_DISABLED]


def append_events(declaration: Declaration, *events: dict[str, object]) -> None:
    seed(QueueTables.of(declaration, "q"), EVENTS, pa.Table.from_pylist(list(events), schema=schemas.EVENTS))


def run_alert(declaration: Declaration, request: RunRequest) -> Any:
    job = queue_disabled_job(declaration, "q")
    with DagsterInstance.ephemeral() as instance:
        return job.execute_in_process(run_config={**request.run_config, **QUIET}, tags=request.tags,
                                      instance=instance, raise_on_error=False)


def failure_of(result: Any) -> Any:
    [failure] = [e for e in result.all_events if e.is_step_failure]
    return failure.step_failure_data


def test_no_events_table_requests_nothing_and_says_so(declare):
    result = evaluate(declare(), None)
    assert not result.run_requests and "never disabled" in result.skip_reason.skip_message
    assert json.loads(result.cursor)["version"] is None


def test_no_events_requests_nothing_and_sets_the_cursor(declare):
    declaration = declare()
    QueueTables.of(declaration, "q").ensure()
    result = evaluate(declaration, None)
    assert not result.run_requests
    assert json.loads(result.cursor) == {"version": 0, "raised": 0, "last_event_id": None, "last_event_at": None}


def test_one_disabled_event_requests_one_run_keyed_by_its_id(declare):
    declaration = declare()
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    result = evaluate(declaration, None)
    [event] = disabled_events(declaration)
    [request] = result.run_requests
    assert request.run_key == event["event_id"]
    assert request.tags == {"poison_pipeline/alert_queue": "q", "poison_pipeline/event_id": event["event_id"]}
    config = request.run_config["ops"]["q__raise_queue_disabled"]["config"]["events"][0]
    assert config["reason"] == "maintenance window" and config["actor"] == "ops"
    assert config["kind"] == QUEUE_DISABLED and config["at"] == event["at"].isoformat()
    cursor = json.loads(result.cursor)
    assert cursor["last_event_id"] == event["event_id"] and cursor["raised"] == 1 and cursor["version"] == 1


def test_the_same_cursor_again_requests_nothing(declare):
    declaration = declare()
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    first = evaluate(declaration, None)
    second = evaluate(declaration, first.cursor)
    assert not second.run_requests and "no new event" in second.skip_reason.skip_message
    assert json.loads(second.cursor) == json.loads(first.cursor)


def test_a_later_event_requests_only_that_one(declare):
    declaration = declare()
    tables = QueueTables.of(declaration, "q")
    set_enabled(tables, False, "ops", "first outage")
    first = evaluate(declaration, None)
    set_enabled(tables, True, "ops", "fixed")
    set_enabled(tables, False, "poison_pipeline", "second outage")
    second = evaluate(declaration, first.cursor)
    [request] = second.run_requests
    latest = max(disabled_events(declaration), key=lambda r: r["at"])
    assert request.run_key == latest["event_id"] != first.run_requests[0].run_key
    assert request.run_config["ops"]["q__raise_queue_disabled"]["config"]["events"][0]["reason"] == "second outage"
    cursor = json.loads(second.cursor)
    assert cursor["raised"] == 2 and cursor["last_event_id"] == latest["event_id"] and cursor["version"] == 3


def test_queue_enabled_events_are_ignored(declare):
    declaration = declare()
    tables = QueueTables.of(declaration, "q")
    set_enabled(tables, False, "ops", "maintenance window")
    first = evaluate(declaration, None)
    set_enabled(tables, True, "ops", "maintenance over")
    second = evaluate(declaration, first.cursor)
    assert not second.run_requests and "no new queue_disabled event" in second.skip_reason.skip_message
    assert json.loads(second.cursor)["version"] == 2
    assert json.loads(second.cursor)["last_event_id"] == first.run_requests[0].run_key


def test_every_event_of_one_commit_is_raised_once_in_order(declare):
    declaration = declare()
    QueueTables.of(declaration, "q").ensure()
    now = datetime.now(UTC)
    events = [event_row(QUEUE_DISABLED, now, "poison_pipeline", f"message m{i} faulted", f"m{i}", "retry_1")
              for i in range(3)]
    append_events(declaration, *events)
    result = evaluate(declaration, json.dumps({"version": 0}))
    assert [r.run_key for r in result.run_requests] == sorted(e["event_id"] for e in events)
    assert not evaluate(declaration, result.cursor).run_requests


def test_a_recreated_events_table_requests_every_event_again_under_the_same_keys(declare):
    declaration = declare()
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    [event] = disabled_events(declaration)
    # A cursor past the table's version: the table was dropped and recreated since.
    result = evaluate(declaration, json.dumps({"version": 40, "last_event_id": "evt-old"}))
    assert [r.run_key for r in result.run_requests] == [event["event_id"]]


def test_a_fault_disposition_is_raised_with_its_message_and_table(spark, declare):
    declaration = declare(max_retry_cycles=0, receive_error_handling="fault")
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    [request] = evaluate(declaration, None).run_requests
    config = request.run_config["ops"]["q__raise_queue_disabled"]["config"]["events"][0]
    assert config["message_id"] == "bad" and config["table"] == "inbound"
    assert "faulted" in config["reason"] and config["actor"] == "poison_pipeline"


def test_the_alert_run_calls_the_hook_then_fails_with_the_reason(declare):
    declaration = declare(alert_hook=RECORD)
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    [request] = evaluate(declaration, None).run_requests
    result = run_alert(declaration, request)
    assert not result.success
    failure = failure_of(result)
    assert "queue 'q' is disabled: maintenance window" in failure.error.message
    assert failure.user_failure_data.metadata["alert_hook"].value == RECORD
    # What a run-failure sensor receives carries the reason too.
    [run_failure] = [e for e in result.all_events if e.is_run_failure]
    assert "queue 'q' is disabled: maintenance window" in run_failure.event_specific_data.error.message
    [event] = alert_hooks.CALLS
    assert (event.queue, event.event_id, event.kind) == ("q", request.run_key, QUEUE_DISABLED)
    assert (event.reason, event.actor) == ("maintenance window", "ops")
    assert event.as_dict()["at"] == request.run_config["ops"]["q__raise_queue_disabled"]["config"]["events"][0]["at"]


def test_a_hook_that_raises_fails_the_run_naming_its_error(declare):
    declaration = declare(alert_hook=BROKEN)
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    [request] = evaluate(declaration, None).run_requests
    failure = failure_of(run_alert(declaration, request))
    assert "queue 'q' is disabled: maintenance window" in failure.error.message
    assert f"the alert hook {BROKEN} failed too: ChatDown: chat webhook answered 503" in failure.error.message
    assert "ChatDown" in failure.error.cause.cls_name
    assert failure.user_failure_data.metadata["alert_hook_error"].value.startswith("ChatDown")


def test_without_a_hook_the_run_still_fails_with_the_reason(declare):
    declaration = declare()
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    [request] = evaluate(declaration, None).run_requests
    failure = failure_of(run_alert(declaration, request))
    assert "queue 'q' is disabled: maintenance window (by ops at " in failure.error.message
    assert failure.user_failure_data.metadata["alert_hook"].value == "none declared"


def test_the_definitions_hold_an_alert_sensor_and_job_per_queue(tmp_path):
    declaration = parse_declaration({
        "lake_root": str(tmp_path / "lake"), "alert_hook": RECORD,
        "queues": {"orders": queue()["q"], "inventory": queue()["q"]},
    })
    repository = build_definitions(declaration).get_repository_def()
    sensors = {s.name: s for s in repository.sensor_defs}
    for name in ("orders", "inventory"):
        sensor = sensors[alert_sensor_name(name)]
        assert sensor.job_name == alert_job_name(name)
        assert sensor.default_status == DefaultSensorStatus.RUNNING
        assert repository.has_job(alert_job_name(name))


def test_an_alert_hook_that_cannot_be_imported_fails_at_load(declare):
    with pytest.raises(DeclarationError) as error:
        declare(alert_hook="poison_pipeline_tests.alert_hooks:missing")
    assert "alert_hook = 'poison_pipeline_tests.alert_hooks:missing'" in str(error.value)
    assert "cannot be imported" in str(error.value)


def test_a_cycle_on_a_disabled_queue_logs_and_records_why_it_did_nothing(spark, declare):
    declaration = declare()
    send(declaration, {"ok": {}})
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "database maintenance")
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(job_name("q", "inbound")).execute_in_process(
            instance=instance, run_config=QUIET)
        logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("q/inbound: processed nothing: queue 'q' is disabled: database maintenance" in m for m in logs)
    [event] = result.get_asset_materialization_events()
    metadata = event.step_materialization_data.materialization.metadata
    assert metadata["skipped"].value == "queue 'q' is disabled: database maintenance"
    assert metadata["messages"].value == 0


def _events(count: int) -> list[QueueEvent]:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return [QueueEvent("q", f"e{i}", MESSAGES_FAILED, at, None, None) for i in range(count)]


def test_events_are_batched_by_size_and_keyed_by_their_first():
    runs = batches(_events(250), lambda key: None, 100)
    assert [len(run) for run in runs] == [100, 100, 50]
    assert [run[0].event_id for run in runs] == ["e0", "e100", "e200"]


def test_events_runs_already_hold_are_left_out_whatever_their_batches_were():
    # Earlier runs: e0 held e0-e4, e5 held e5-e8 (requested by evaluations that saw fewer events).
    held = {"e0": {f"e{i}" for i in range(5)}, "e5": {f"e{i}" for i in range(5, 9)}}
    asked: list[str] = []

    def raised(key: str) -> set[str] | None:
        asked.append(key)
        return set(held[key]) if key in held else None

    runs = batches(_events(12), raised, 100)
    assert [[e.event_id for e in run] for run in runs] == [["e9", "e10", "e11"]]
    assert asked == ["e0", "e5", "e9"]


def test_the_run_tags_the_sensor_reads_are_the_ones_dagster_writes():
    from dagster._core.storage import tags

    from poison_pipeline.defs import naming

    assert (naming.RUN_KEY_TAG, naming.SENSOR_NAME_TAG) == (tags.RUN_KEY_TAG, tags.SENSOR_NAME_TAG)
