"""Operator actions launchable from the Dagster UI (issue 9): enable, end-conversation, edit, purge
and undo jobs with typed run config, recorded in the actions ledger with the actor and the run id;
the daily retention schedule; invalid config refused before any table changes."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, DefaultScheduleStatus

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import (
    ACTOR_TAG,
    QUEUE_TAG,
    USER_TAG,
    maintenance_schedule_name,
    operator_job_name,
    operator_op_name,
    retention_schedule_name,
    simulation_asset_key,
)
from poison_pipeline.operations.actions import DONE, list_actions
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.purge import RETENTION_ACTOR
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.dagster_support import QUIET, copy_lake, declare, failure_text, run_config
from poison_pipeline_tests.support import places, rows, table_versions

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
POLICY = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "outage_threshold": 0}
NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def built_lake(spark, tmp_path_factory: pytest.TempPathFactory):
    """Queue q: `old` failed 40 days ago and `p-0`, `p-1` today (all in poison); `c-0`, `c-1` wait in
    the inbound on conversation c1. Queue other is empty; it declares no retention, q does."""
    root = tmp_path_factory.mktemp("operator_lake")
    declaration = declare(root / "lake", {
        "q": {"handler": RECORDING, "policy": POLICY, "retention": {"poison": "30d"}},
        "other": {"handler": RECORDING, "policy": POLICY}})
    for moment, ids in ((NOW - timedelta(days=40), ["old"]), (NOW, ["p-0", "p-1"])):
        records = [{"message_id": m, "message_type": "order", "body": {"fail": True}} for m in ids]
        assert not enqueue(declaration, "q", records, now=moment).refused
        run_cycle(spark, declaration, "q", "inbound", now=moment)
    assert not enqueue(declaration, "q", [{"message_id": f"c-{i}", "message_type": "order", "body": {},
                                            "conversation_id": "c1", "sequence_number": i}
                                           for i in range(2)]).refused
    return declaration


@pytest.fixture
def lake(built_lake, tmp_path: Path):
    return copy_lake(built_lake, tmp_path)


def launch(declaration, action: str, config: dict[str, Any], queue: str = "q", **kwargs: Any):
    job = build_definitions(declaration).resolve_job_def(operator_job_name(queue, action))
    with DagsterInstance.ephemeral() as instance:
        return job.execute_in_process(instance=instance, run_config=run_config(operator_op_name(queue, action), config),
                                      raise_on_error=False, **kwargs)


def output_metadata(result, action: str, queue: str = "q") -> dict[str, Any]:
    [event] = [e for e in result.all_events if e.is_successful_output]
    assert event.step_key == operator_op_name(queue, action)
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}


def action_of(declaration, kind: str):
    [action] = [a for a in list_actions(declaration, "q") if a.kind == kind]
    return action


def test_every_operator_job_of_a_queue_carries_its_tag_and_the_retention_schedule_starts_stopped(lake):
    defs = build_definitions(lake)
    for queue in ("q", "other"):
        for action in ("enable", "end_conversation", "edit", "purge", "undo", "simulate"):
            assert defs.resolve_job_def(operator_job_name(queue, action)).tags[QUEUE_TAG] == queue
    schedules = {s.name: s for s in defs.get_repository_def().schedule_defs}
    # `other` declares no retention; every queue has its maintenance schedule.
    assert sorted(schedules) == sorted([retention_schedule_name("q"), maintenance_schedule_name("q"),
                                        maintenance_schedule_name("other")])
    schedule = schedules[retention_schedule_name("q")]
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    assert schedule.job.tags[QUEUE_TAG] == "q"


def test_enable_resumes_the_queue_recording_the_user_of_the_run_and_its_id(lake):
    tables = QueueTables.of(lake, "q")
    set_enabled(tables, False, "ops", "database maintenance")
    result = launch(lake, "enable", {"reason": "database is back"}, tags={USER_TAG: "alice"})
    assert result.success and queue_state(tables).enabled
    action = action_of(lake, "enable")
    assert (action.actor, action.run_id, action.state) == ("alice", result.run_id, DONE)
    assert action.arguments == {"reason": "database is back"}
    assert output_metadata(result, "enable")["changed"] == 1


def test_end_conversation_dead_letters_its_messages_with_the_actor_of_the_config(lake):
    result = launch(lake, "end_conversation", {"conversation_id": "c1", "code": 42, "description": "obsolete",
                                               "actor": "bob"}, tags={USER_TAG: "alice"})
    assert result.success
    where = places(lake)
    assert where["c-0"] == where["c-1"] == ["dead_letter"]
    action = action_of(lake, "end_conversation")
    assert (action.actor, action.run_id) == ("bob", result.run_id)


def test_edit_takes_the_new_body_as_text_and_sends_the_message_back(lake):
    result = launch(lake, "edit", {"message_id": "p-0", "body": json.dumps({"fixed": True}),
                                   "headers": {"fixed-by": "carol"}}, tags={ACTOR_TAG: "carol"})
    assert result.success
    back = next(r for r in rows(lake, "inbound") if r["message_id"] == "p-0")
    assert json.loads(back["body"]) == {"fixed": True}
    assert dict(back["headers"])["fixed-by"] == "carol"
    assert places(lake)["p-0"] == ["inbound"]
    action = action_of(lake, "edit")
    assert (action.actor, action.run_id, action.state) == ("carol", result.run_id, DONE)


def test_purge_without_confirm_only_previews_then_deletes_and_undo_brings_them_back(lake):
    before = table_versions(lake)
    preview = launch(lake, "purge", {"table": "poison", "older_than": "30d"})
    assert preview.success and table_versions(lake) == before
    assert output_metadata(preview, "purge")["would_purge"] == 1
    purged = launch(lake, "purge", {"table": "poison", "older_than": "30d", "confirm": True})
    assert purged.success and "old" not in places(lake)
    action = action_of(lake, "purge")
    assert action.action_id == f"purge--run-{purged.run_id}" and action.run_id == purged.run_id
    undone = launch(lake, "undo", {"action_id": action.action_id, "actor": "dave"})
    assert undone.success and places(lake)["old"] == ["poison"]
    undo = action_of(lake, "undo")
    assert (undo.actor, undo.run_id) == ("dave", undone.run_id)


def test_the_retention_job_purges_what_failed_longer_ago_than_declared(lake):
    defs = build_definitions(lake)
    schedule = {s.name: s for s in defs.get_repository_def().schedule_defs}[retention_schedule_name("q")]
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(schedule.job_name).execute_in_process(instance=instance, run_config=QUIET)
    assert result.success
    where = places(lake)
    assert "old" not in where and where["p-0"] == where["p-1"] == ["poison"]
    action = action_of(lake, "purge")
    assert (action.actor, action.run_id) == (RETENTION_ACTOR, result.run_id)


@pytest.mark.parametrize(("action", "config", "says"), [
    ("enable", {"reason": "  "}, "reason"),
    ("end_conversation", {"conversation_id": "c1", "code": 0, "description": "x"}, "code"),
    ("edit", {"message_id": "p-0", "body": "not base64!", "encoding": "base64"}, "body is not base64"),
    ("edit", {"message_id": "p-0", "body": "{not json"}, "encoding 'json'"),
    ("edit", {"message_id": "p-0", "body": "{}", "source": "inbound"}, "source"),
    ("purge", {"table": "poison", "older_than": "a while"}, "older_than"),
    ("purge", {"table": "processed", "older_than": "1d", "confirm": True}, "table"),
    ("purge", {"table": "poison", "older_than": "1d", "failed_after": "yesterday", "confirm": True}, "failed_after"),
    ("undo", {"action_id": "redrive-nothing"}, "no such action in queue 'q'"),
])
def test_invalid_config_fails_before_touching_any_table_naming_what_is_wrong(lake, action, config, says):
    before = table_versions(lake)
    result = launch(lake, action, config)
    assert not result.success
    assert says in failure_text(result)
    assert table_versions(lake) == before


def test_undo_of_another_queues_action_names_the_job_to_run(lake):
    purged = launch(lake, "purge", {"table": "poison", "older_than": "30d", "confirm": True})
    before = table_versions(lake)
    result = launch(lake, "undo", {"action_id": f"purge--run-{purged.run_id}"}, queue="other")
    assert not result.success and "run q__undo" in failure_text(result)
    assert table_versions(lake) == before


def test_edit_of_a_binary_body_takes_base64(lake):
    # A text body, written as base64: what an operator does for a body that is not text.
    body = base64.b64encode(json.dumps({"fixed": 2}).encode()).decode()
    result = launch(lake, "edit", {"message_id": "p-1", "body": body, "encoding": "base64"})
    assert result.success
    assert json.loads(next(r["body"] for r in rows(lake, "inbound") if r["message_id"] == "p-1")) == {"fixed": 2}


def test_simulate_records_its_report_as_the_metadata_of_the_queues_simulation_asset(lake):
    before = table_versions(lake)
    candidate = "receive_retry_count: 2\nmax_retry_cycles: 1\nreceive_error_handling: reject\n"
    job = build_definitions(lake).resolve_job_def(operator_job_name("q", "simulate"))
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=run_config(
            operator_op_name("q", "simulate"), {"policy_yaml": candidate, "since": "7d"}))
        assert result.success
        event = instance.get_latest_materialization_event(simulation_asset_key("q"))
    assert event is not None and event.run_id == result.run_id
    metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    # old, p-0 and p-1 were poisoned after one attempt: the candidate would dead-letter them.
    assert metadata["messages"] == 3 and metadata["changed"] == 3
    assert metadata["simulated"] == {"dead_lettered": 3} and metadata["recorded"] == {"poisoned": 3}
    report = metadata["report"]
    assert "| message type | failure group | messages |" in report and "| order |" in report
    assert "never happened" in report
    assert table_versions(lake) == before

    bad = launch(lake, "simulate", {"policy_yaml": "backoff: {initial: 1m, multiplier: -1}"})
    assert not bad.success and "backoff.multiplier = -1" in failure_text(bad)


def test_an_operator_run_is_tagged_with_its_actor_and_whether_it_previews_and_materializes_what_it_changed(lake):
    job = build_definitions(lake).resolve_job_def(operator_job_name("q", "purge"))
    step = operator_op_name("q", "purge")
    found = {}
    with DagsterInstance.ephemeral() as instance:
        for confirm in (False, True):
            result = job.execute_in_process(instance=instance, run_config=run_config(step, {
                "table": "poison", "older_than": "30d", "confirm": confirm, "actor": "erin"}))
            run = instance.get_run_by_id(result.run_id)
            assert run is not None
            found[confirm] = (run.tags["poison_pipeline/dry_run"], run.tags["poison_pipeline/actor"],
                              {m.asset_key.path[-1]: m.metadata["rows"].value
                               for m in result.asset_materializations_for_node(step)})
    # The preview changed nothing, so it materializes nothing; the purge materializes poison: "old"
    # left, two stay.
    assert found == {False: ("true", "erin", {}), True: ("false", "erin", {"poison": 2})}



@pytest.mark.parametrize(("action", "config", "previews"), [
    ("simulate", {"policy_yaml": "max_retry_cycles: 3"}, "true"),  # changes nothing
    ("archive", {"table": "poison", "ids": ["old"], "dry_run": True}, "true"),
    ("enable", {"reason": "back"}, None),  # no preview to tell apart
])
def test_each_operator_job_says_whether_its_run_only_previews(lake, action, config, previews):
    job = build_definitions(lake).resolve_job_def(operator_job_name("q", action))
    with DagsterInstance.ephemeral() as instance:
        result = job.execute_in_process(instance=instance, run_config=run_config(operator_op_name("q", action), config))
        run = instance.get_run_by_id(result.run_id)
    assert result.success and run is not None
    assert run.tags.get("poison_pipeline/dry_run") == previews
