"""Alerts for new failures and failure groups in the UI: real cycle runs in Dagster, real sensor
evaluations and real alert runs (SPEC sections 8 and 9; issue 9, items 4 and 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import DagsterInstance, Definitions, RunRequest, SensorResult, build_sensor_context
from deltalake import DeltaTable

from poison_pipeline.defs.alerts import messages_failed_sensor
from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import (
    RUN_KEY_TAG,
    SENSOR_NAME_TAG,
    alert_job_name,
    alert_sensor_name,
    asset_key,
    job_name,
)
from poison_pipeline.domain.alerts import MESSAGES_FAILED
from poison_pipeline.domain.declaration import Declaration, parse_declaration
from poison_pipeline.operations.groups import failure_groups, group_id
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline_tests import alert_hooks
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.support import queue, rows

QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
RECORD = "poison_pipeline_tests.alert_hooks:record"
BROKEN = "poison_pipeline_tests.alert_hooks:broken"
OP = f"q__raise_{MESSAGES_FAILED}"


@pytest.fixture(autouse=True)
def _no_recorded_calls() -> Iterator[None]:
    alert_hooks.CALLS.clear()
    yield
    alert_hooks.CALLS.clear()


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


def declare(tmp_path: Path, alert_hook: str | None = RECORD, **settings: Any) -> Declaration:
    data: dict[str, Any] = {"lake_root": str(tmp_path / "lake"), "spark": SPARK.model_dump(),
                            "queues": queue(max_retry_cycles=0, receive_error_handling="move"), **settings}
    if alert_hook:
        data["alert_hook"] = alert_hook
    return parse_declaration(data)


def send(declaration: Declaration, bodies: dict[str, dict[str, Any]], expired: tuple[str, ...] = ()) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    records = [{"message_id": mid, "message_type": "test", "body": body,
                **({"expires_at": past} if mid in expired else {})} for mid, body in bodies.items()]
    assert not enqueue(declaration, "q", records).refused


def run_cycle_job(defs: Definitions, instance: DagsterInstance, table: str) -> Any:
    result = defs.resolve_job_def(job_name("q", table)).execute_in_process(instance=instance, run_config=QUIET)
    assert result.success
    return result


def evaluate(declaration: Declaration, instance: DagsterInstance, cursor: str | None) -> SensorResult:
    result = messages_failed_sensor(declaration, "q")(build_sensor_context(instance=instance, cursor=cursor))
    assert isinstance(result, SensorResult)
    return result


def run_alert(defs: Definitions, instance: DagsterInstance, request: RunRequest) -> Any:
    return defs.resolve_job_def(alert_job_name("q", MESSAGES_FAILED)).execute_in_process(
        run_config={**request.run_config, **QUIET}, tags=request.tags, instance=instance, raise_on_error=False)


def launch(defs: Definitions, instance: DagsterInstance, request: RunRequest) -> Any:
    """The alert run as the sensor daemon launches it: tagged with the sensor and the run key."""
    tags = {**request.tags, RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: alert_sensor_name("q", MESSAGES_FAILED)}
    return defs.resolve_job_def(alert_job_name("q", MESSAGES_FAILED)).execute_in_process(
        run_config={**request.run_config, **QUIET}, tags=tags, instance=instance, raise_on_error=False)


def config_of(request: RunRequest) -> dict[str, Any]:
    """The one event `request` raises."""
    [event] = request.run_config["ops"][OP]["config"]["events"]
    return event


def counts_of(request: RunRequest) -> dict[tuple[str, str], int]:
    return {(f["table"], f["group"]): f["count"] for f in config_of(request)["failures"]}


def materializations(result: Any) -> dict[str, dict[str, Any]]:
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        found[materialization.asset_key.path[-1]] = {k: v.value for k, v in materialization.metadata.items()}
    return found


# Two bugs (three and two messages), an expired message and a good one.
MIXED = {"a1": {"fail": True}, "a2": {"fail": True}, "a3": {"fail": True},
         "u1": {"unfixable": True}, "u2": {"unfixable": True}, "ok": {}, "old": {}}


def test_a_failing_cycle_raises_one_alert_with_its_counts_per_group(tmp_path, instance):
    declaration = declare(tmp_path)
    defs = build_definitions(declaration)
    send(declaration, MIXED, expired=("old",))
    cycle = run_cycle_job(defs, instance, "inbound")

    result = evaluate(declaration, instance, None)
    [request] = result.run_requests
    [event] = [r for r in rows(declaration, EVENTS) if r["kind"] == MESSAGES_FAILED]
    assert request.run_key == event["event_id"]
    assert request.tags == {"poison_pipeline/alert_queue": "q", "poison_pipeline/event_id": event["event_id"]}
    config = config_of(request)
    # The cycle's Dagster run (a link in the alert run) and its seq in the table's journal.
    assert (config["run_id"], config["cycle_seq"], config["table"]) == (cycle.run_id, 1, "inbound")
    # Counted per group with the ids `groups` gives those rows, and as many as the tables hold.
    expected = {(g.table, g.id): g.count for g in failure_groups(declaration, "q")}
    assert counts_of(request) == expected
    assert sorted(expected.values()) == [1, 2, 3]
    assert expected[("dead_letter", group_id("no-error:expired"))] == 1
    assert config["reason"] == "inbound cycle 1 poisoned 5 and dead-lettered 1 message(s) in 3 failure group(s)"

    alert = run_alert(defs, instance, request)
    assert alert.success
    [called] = alert_hooks.CALLS
    assert (called.kind, called.run_id, called.cycle_seq) == (MESSAGES_FAILED, cycle.run_id, 1)
    assert {(f.table, f.group): f.count for f in called.failures} == expected
    assert called.describe().startswith("queue 'q': inbound cycle 1 poisoned 5 and dead-lettered 1")
    [output] = [e for e in alert.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.step_output_data.metadata
    assert metadata["cycle_run"].value == cycle.run_id
    assert (metadata["failed_messages"].value, metadata["failure_groups"].value) == (6, 3)
    assert "| poison |" in metadata["failures"].value and "ValueError" in metadata["failures"].value

    # Evaluated again, with the cursor it returned: nothing more.
    again = evaluate(declaration, instance, result.cursor)
    assert not again.run_requests and "no new event" in again.skip_reason.skip_message


def test_a_clean_cycle_raises_nothing(tmp_path, instance):
    declaration = declare(tmp_path)
    defs = build_definitions(declaration)
    send(declaration, {"ok1": {}, "ok2": {}})
    run_cycle_job(defs, instance, "inbound")
    result = evaluate(declaration, instance, None)
    assert not result.run_requests
    assert "no new messages_failed event" in result.skip_reason.skip_message
    assert not [r for r in rows(declaration, EVENTS) if r["kind"] == MESSAGES_FAILED]


def test_nothing_enqueued_says_why_there_is_nothing_to_raise(tmp_path, instance):
    result = evaluate(declare(tmp_path), instance, None)
    assert not result.run_requests and "no cycle of it has failed a message" in result.skip_reason.skip_message


def test_each_failing_cycle_is_raised_once_and_only_it(tmp_path, instance):
    declaration = declare(tmp_path)
    defs = build_definitions(declaration)
    send(declaration, {"a1": {"fail": True}, "a2": {"fail": True}})
    first_cycle = run_cycle_job(defs, instance, "inbound")
    first = evaluate(declaration, instance, None)
    send(declaration, {"ok": {}})
    run_cycle_job(defs, instance, "inbound")
    clean = evaluate(declaration, instance, first.cursor)
    assert not clean.run_requests
    send(declaration, {"u1": {"unfixable": True}})
    third_cycle = run_cycle_job(defs, instance, "inbound")
    third = evaluate(declaration, instance, clean.cursor)
    [request] = third.run_requests
    assert (config_of(request)["cycle_seq"], config_of(request)["run_id"]) == (3, third_cycle.run_id)
    assert list(counts_of(request).values()) == [1]
    assert not evaluate(declaration, instance, third.cursor).run_requests
    assert config_of(first.run_requests[0])["run_id"] == first_cycle.run_id
    # A lost cursor (a sensor reset) sees both cycles again: once their runs were launched, nothing.
    for launched in (first.run_requests[0], request):
        assert launch(defs, instance, launched).success
    reset = evaluate(declaration, instance, None)
    assert not reset.run_requests and "raised already" in reset.skip_reason.skip_message


def test_the_cycles_one_evaluation_finds_share_one_run_and_each_is_raised_once(tmp_path, instance):
    """A queue failing messages every cycle raises a run per sensor evaluation, not per cycle; the
    hook is still called once per cycle, and a lost cursor raises only what no run holds."""
    declaration = declare(tmp_path)
    defs = build_definitions(declaration)
    cycles = []
    for mid in ("a1", "a2"):
        send(declaration, {mid: {"fail": True}})
        cycles.append(run_cycle_job(defs, instance, "inbound"))
    [request] = evaluate(declaration, instance, None).run_requests
    events = request.run_config["ops"][OP]["config"]["events"]
    assert [e["run_id"] for e in events] == [c.run_id for c in cycles]
    assert request.run_key == events[0]["event_id"]

    alert = launch(defs, instance, request)
    assert alert.success
    assert [(c.cycle_seq, c.run_id) for c in alert_hooks.CALLS] == [(1, cycles[0].run_id), (2, cycles[1].run_id)]
    [output] = [e for e in alert.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.step_output_data.metadata
    assert (metadata["cycles"].value, metadata["failed_messages"].value) == (2, 2)
    assert metadata["cycle_run"].value == cycles[1].run_id

    # A third failing cycle, then a lost cursor: the batch's run holds the first two events, so
    # only the third is requested, in a run of its own key.
    send(declaration, {"a3": {"fail": True}})
    third = run_cycle_job(defs, instance, "inbound")
    [again] = evaluate(declaration, instance, None).run_requests
    assert [e["run_id"] for e in again.run_config["ops"][OP]["config"]["events"]] == [third.run_id]
    assert again.run_key != request.run_key


def test_a_failed_message_is_raised_once_not_again_when_the_poison_cycle_quarantines_it(tmp_path, instance):
    declaration = declare(tmp_path)
    defs = build_definitions(declaration)
    send(declaration, {"a1": {"fail": True}, "u1": {"unfixable": True}})
    run_cycle_job(defs, instance, "inbound")
    first = evaluate(declaration, instance, None)
    assert len(first.run_requests) == 1
    run_cycle_job(defs, instance, "poison")
    assert failure_groups(declaration, "q", "quarantine")  # the poison cycle did quarantine them
    after = evaluate(declaration, instance, first.cursor)
    assert not after.run_requests
    assert "raised when they were poisoned" in after.skip_reason.skip_message
    # A message that fails again after a redrive is a new failure: raised again.
    send(declaration, {"a2": {"fail": True}})
    run_cycle_job(defs, instance, "inbound")
    [again] = evaluate(declaration, instance, after.cursor).run_requests
    assert config_of(again)["table"] == "inbound"


def test_a_hook_that_raises_fails_the_alert_run_naming_its_error(tmp_path, instance):
    declaration = declare(tmp_path, alert_hook=BROKEN)
    defs = build_definitions(declaration)
    send(declaration, {"a1": {"fail": True}})
    run_cycle_job(defs, instance, "inbound")
    [request] = evaluate(declaration, instance, None).run_requests
    alert = run_alert(defs, instance, request)
    assert not alert.success
    [failure] = [e for e in alert.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message
    assert "inbound cycle 1 poisoned 1 message(s)" in message
    assert f"the alert hook {BROKEN} failed: ChatDown: chat webhook answered 503" in message


def test_a_hook_past_the_hook_timeout_fails_the_alert_run_saying_so(tmp_path, instance):
    declaration = declare(tmp_path, alert_hook="poison_pipeline_tests.alert_hooks:slow", hook_timeout="1s")
    defs = build_definitions(declaration)
    send(declaration, {"a1": {"fail": True}})
    run_cycle_job(defs, instance, "inbound")
    [request] = evaluate(declaration, instance, None).run_requests
    alert = run_alert(defs, instance, request)
    assert not alert.success and alert_hooks.CALLS == []
    [failure] = [e for e in alert.all_events if e.is_step_failure]
    assert "HookTimeout: the hook poison_pipeline_tests.alert_hooks:slow ran longer than the hook_timeout of 1s" \
        in failure.step_failure_data.error.message


def test_without_a_hook_the_alert_run_still_shows_the_failures(tmp_path, instance):
    declaration = declare(tmp_path, alert_hook=None)
    defs = build_definitions(declaration)
    send(declaration, {"a1": {"fail": True}})
    run_cycle_job(defs, instance, "inbound")
    [request] = evaluate(declaration, instance, None).run_requests
    alert = run_alert(defs, instance, request)
    assert alert.success
    logs = [entry.user_message for entry in instance.all_logs(alert.run_id)]
    assert any("queue 'q': inbound cycle 1 poisoned 1 message(s) in 1 failure group(s)" in m for m in logs)


GROUP_KEYS = {"failure_groups", "failed_messages", "largest_failure_group", "failure_groups_top"}


def test_every_materialization_of_the_failure_tables_carries_their_groups(tmp_path, instance):
    declaration = declare(tmp_path)
    defs = build_definitions(declaration)
    send(declaration, MIXED, expired=("old",))
    inbound = materializations(run_cycle_job(defs, instance, "inbound"))
    # The inbound cycle wrote dead_letter (and poison, whose own cycle reports it); not quarantine.
    assert set(inbound) == {"inbound", "dead_letter"}
    dead_letter = inbound["dead_letter"]
    assert set(dead_letter) >= GROUP_KEYS
    assert (dead_letter["failure_groups"], dead_letter["failed_messages"], dead_letter["rows"]) == (1, 1, 1)
    # Each group named with the version of the table read (`id@version`: an action given it takes that snapshot).
    version = QueueTables.of(declaration, "q").open("dead_letter").version()
    assert f"| {group_id('no-error:expired')}@{version} | 1 |" in dead_letter["failure_groups_top"]

    # A disabled queue's poison cycle processes nothing; its materialization still shows the groups.
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance")
    poison = materializations(run_cycle_job(defs, instance, "poison"))["poison"]
    assert (poison["failure_groups"], poison["failed_messages"], poison["largest_failure_group"]) == (2, 5, 3)
    top = poison["failure_groups_top"]
    [biggest, other] = failure_groups(declaration, "q", "poison")
    first = biggest.first_failure_at.strftime("%Y-%m-%d %H:%M:%SZ")
    # The error (class name, message, top frame) and the examples lead; the times follow.
    assert top.splitlines()[0] == ("| group | count | error | e.g. | message types | first failure | last failure "
                                   "| note |")
    assert f"| {biggest.as_of} | 3 | {biggest.error_type.rsplit('.', 1)[-1]}: " in top
    assert f"| {first} |" in top
    assert "." in other.error_type and f"{other.error_type}:" not in top  # its module: in `groups --json`
    assert f"| {other.as_of} | 2 |" in top and "ValueError: message &lt;id&gt; always fails" in top
    # Its message types and latest example ids, as `groups` prints them.
    assert f"| {', '.join(biggest.example_ids)} |" in top and len(biggest.example_ids) == 3

    set_enabled(QueueTables.of(declaration, "q"), True, "ops", "maintenance over")
    after = materializations(run_cycle_job(defs, instance, "poison"))
    assert set(after) == {"poison", "quarantine"}
    assert (after["poison"]["failure_groups"], after["poison"]["failure_groups_top"]) == (0, "no failures")
    assert (after["quarantine"]["failure_groups"], after["quarantine"]["failed_messages"]) == (2, 5)
    # The UI lists them under the assets themselves.
    for table in ("poison", "dead_letter", "quarantine"):
        records = instance.fetch_materializations(asset_key("q", table), limit=10).records
        assert records and all(set(r.asset_materialization.metadata) >= GROUP_KEYS for r in records)


def test_an_events_table_made_before_the_failure_columns_takes_the_events(tmp_path, instance):
    declaration = declare(tmp_path)
    tables = QueueTables.of(declaration, "q")
    old = pa.schema([f for f in schemas.EVENTS if f.name not in ("run_id", "cycle_seq", "failures")])
    DeltaTable.create(tables.uri(EVENTS), schema=old)
    set_enabled(tables, False, "ops", "before the upgrade")
    set_enabled(tables, True, "ops", "after the upgrade")
    defs = build_definitions(declaration)
    send(declaration, {"a1": {"fail": True}})
    cycle = run_cycle_job(defs, instance, "inbound")
    # From before the table gained the columns (its first commits' files lack them) and after.
    for version in (0, 2):
        [request] = evaluate(declaration, instance, json.dumps({"version": version})).run_requests
        assert config_of(request)["run_id"] == cycle.run_id and list(counts_of(request).values()) == [1]


def test_the_definitions_hold_a_failure_alert_sensor_and_job_per_queue(tmp_path):
    declaration = parse_declaration({"lake_root": str(tmp_path / "lake"), "alert_hook": RECORD,
                                     "queues": {"orders": queue()["q"], "inventory": queue()["q"]}})
    repository = build_definitions(declaration).get_repository_def()
    sensors = {s.name: s for s in repository.sensor_defs}
    for name in ("orders", "inventory"):
        sensor = sensors[alert_sensor_name(name, MESSAGES_FAILED)]
        assert sensor.name == f"{name}__messages_failed_sensor"
        assert sensor.job_name == alert_job_name(name, MESSAGES_FAILED) == f"{name}__messages_failed_alert"
        assert repository.has_job(sensor.job_name)
