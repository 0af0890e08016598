"""Redrive as a backfill (issue 9): the daily-partitioned redrive asset of a queue, run for a range of
failure days in one run, resumable by re-execution, refusing bad config before touching a table,
and never at once with a cycle of the same queue."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetKey,
    BackfillPolicy,
    DagsterInstance,
    DagsterInvalidConfigError,
    DailyPartitionsDefinition,
    ReexecutionOptions,
    build_reconstructable_job,
    execute_job,
    instance_for_test,
)
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.dagster_run import DagsterRunStatus, RunsFilter
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG, BACKFILL_ID_TAG
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.backfill import execute_backfill_iteration

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import QUEUE_TAG, USER_TAG, job_name, redrive_asset_key, redrive_job_name
from poison_pipeline.defs.redrive import REDRIVE_START
from poison_pipeline.domain.names import ActionName
from poison_pipeline.operations.actions import DONE, find_action, list_actions
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Committer
from poison_pipeline_tests.dagster_support import (
    QUIET,
    copy_lake,
    declare,
    failure_text,
    run_config,
    write_config,
)
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import places, rows, table_versions

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
POLICY = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "outage_threshold": 0}
TODAY = datetime.now(UTC).replace(hour=10, minute=0, second=0, microsecond=0)
DAYS = [TODAY - timedelta(days=d) for d in (3, 2, 1)]  # three days with failures, oldest first
OP = "q__redrive"


def run_redrive_id(root_run_id: str) -> str:
    """The redrive a run chain runs when its config names no id."""
    return str(ActionName.of_run("redrive", root_run_id))


def day(index: int) -> str:
    return DAYS[index].strftime("%Y-%m-%d")


@pytest.fixture(scope="module")
def built_lake(spark, tmp_path_factory: pytest.TempPathFactory):
    """Queue q with two failures on each of three days: a withdrawal and a refund. The first day's
    went on through the poison cycle to quarantine; the other two days' wait in poison."""
    root = tmp_path_factory.mktemp("redrive_lake")
    declaration = declare(root / "lake", {"q": {"handler": RECORDING, "policy": POLICY}})
    for i, moment in enumerate(DAYS):
        records = [{"message_id": f"d{i}-{kind}", "message_type": kind, "body": {"fail": True}}
                   for kind in ("withdrawal", "refund")]
        assert not enqueue(declaration, "q", records, now=moment).refused
        run_cycle(spark, declaration, "q", "inbound", now=moment)
        if i == 0:
            run_cycle(spark, declaration, "q", "poison", now=moment + timedelta(hours=1))
    return declaration


@pytest.fixture
def lake(built_lake, tmp_path: Path):
    return copy_lake(built_lake, tmp_path)


def redrive_job(declaration):
    return build_definitions(declaration).resolve_job_def(redrive_job_name("q"))


def days(first: int, last: int) -> dict[str, str]:
    return {ASSET_PARTITION_RANGE_START_TAG: day(first), ASSET_PARTITION_RANGE_END_TAG: day(last)}


def metadata(result, partitions: int = 1) -> dict[str, Any]:
    """The materialization's metadata: one materialization per day of the range, all alike."""
    events = [e for e in result.get_asset_materialization_events() if e.asset_key == redrive_asset_key("q")]
    assert len(events) == partitions
    first = events[0].step_materialization_data.materialization.metadata
    assert all(e.step_materialization_data.materialization.metadata == first for e in events)
    return {k: v.value for k, v in first.items()}


def previewed(result) -> dict[str, Any]:
    """A dry run's metadata: one observation of the redrive asset, and no materialization (no
    failure day is marked redriven)."""
    assert result.success and not result.get_asset_materialization_events()  # no failure table either
    [observation] = [o for o in result.asset_observations_for_node(OP) if o.asset_key == redrive_asset_key("q")]
    return {k: v.value for k, v in observation.metadata.items()}


def test_the_redrive_asset_is_partitioned_by_failure_day_downstream_of_the_failure_tables(lake):
    defs = build_definitions(lake)
    graph = defs.resolve_asset_graph()
    node = graph.get(redrive_asset_key("q"))
    assert node.parent_keys == {AssetKey(["q", t]) for t in ("poison", "dead_letter", "quarantine")}
    assert node.child_keys == set()  # not upstream of the inbound it writes to: lineage stays acyclic
    assert isinstance(node.partitions_def, DailyPartitionsDefinition)
    keys = node.partitions_def.get_partition_keys()
    assert keys[0] == REDRIVE_START and {day(0), day(1), day(2), TODAY.strftime("%Y-%m-%d")} <= set(keys)
    assert node.backfill_policy == BackfillPolicy.single_run()
    assert "q/inbound" in node.description and node.metadata["redrives_into"] == "q/inbound"
    assert defs.resolve_job_def(redrive_job_name("q")).tags[QUEUE_TAG] == "q"


def test_a_range_of_two_days_is_redriven_in_one_run_and_the_third_day_stays(lake):
    with DagsterInstance.ephemeral() as instance:
        result = redrive_job(lake).execute_in_process(
            instance=instance, run_config=QUIET, tags={**days(0, 1), USER_TAG: "alice"})
        run = instance.get_run_by_id(result.run_id)
    assert result.success
    assert run is not None and (run.tags["poison_pipeline/dry_run"], run.tags["poison_pipeline/actor"]) == (
        "false", "alice")
    where = places(lake)
    assert {m: where[m] for m in where if m.startswith(("d0", "d1"))} == {
        m: ["inbound"] for m in ("d0-withdrawal", "d0-refund", "d1-withdrawal", "d1-refund")}
    assert where["d2-withdrawal"] == where["d2-refund"] == ["poison"]
    seen = metadata(result, partitions=2)
    assert (seen["moved"], seen["dry_run"], seen["target"]) == (4, False, "q/inbound")
    assert seen["by_message_type"] == {"withdrawal": 2, "refund": 2}
    assert seen["by_source"] == {"poison": {"moved": 2, "selected": 2}, "dead_letter": {"moved": 0, "selected": 0},
                                 "quarantine": {"moved": 2, "selected": 2}}
    # One redrive per source table, recorded with the run and the user who launched it.
    actions = {a.action_id: a for a in list_actions(lake, "q")}
    assert sorted(seen["redrive_ids"]) == sorted(actions)
    assert sorted(actions) == sorted(f"{run_redrive_id(result.run_id)}--{t}" for t in ("poison", "quarantine"))
    assert all(a.state == DONE and a.actor == "alice" and a.run_id == result.run_id for a in actions.values())


def test_a_dry_run_reports_what_would_move_and_changes_no_table(lake):
    before = table_versions(lake)
    with DagsterInstance.ephemeral() as instance:
        result = redrive_job(lake).execute_in_process(
            instance=instance, run_config=run_config(OP, {"dry_run": True, "message_type": "withdrawal"}),
            partition_key=day(1))
        run = instance.get_run_by_id(result.run_id)
    assert result.success and table_versions(lake) == before
    seen = previewed(result)
    assert (seen["dry_run"], seen["would_move"], seen["sample_ids"]) == (True, 1, ["d1-withdrawal"])
    assert run is not None and (run.tags["poison_pipeline/dry_run"], run.tags["poison_pipeline/actor"]) == (
        "true", "dagster")
    assert "moved" not in seen  # a dry run moved nothing
    assert seen["by_message_type"] == {"withdrawal": 1} and sum(seen["by_group"].values()) == 1
    assert seen["redrive_ids"] == []


def test_a_failure_group_selects_its_rows_in_every_source_table_that_has_them(lake):
    # The error message names the message type ("message d0-withdrawal always fails"): one group per type.
    [group] = {g.id for t in ("poison", "quarantine") for g in failure_groups(lake, "q", t)
               if g.message_types == {"withdrawal": 1} or g.message_types == {"withdrawal": 2}}
    with DagsterInstance.ephemeral() as instance:
        result = redrive_job(lake).execute_in_process(
            instance=instance, run_config=run_config(OP, {"dry_run": True, "group": group}), tags=days(0, 2))
    seen = previewed(result)
    assert seen["by_group"] == {group: 3} and seen["by_message_type"] == {"withdrawal": 3}
    assert seen["by_source"] == {"poison": {"would_move": 2, "selected": 2},
                                 "quarantine": {"would_move": 1, "selected": 1}}


@pytest.mark.parametrize("table", ["quarantin", "inbound"])
def test_an_unknown_source_table_is_refused_by_the_launch_config_before_any_run(lake, table):
    before = table_versions(lake)
    with DagsterInstance.ephemeral() as instance, pytest.raises(DagsterInvalidConfigError) as refused:
        redrive_job(lake).execute_in_process(instance=instance, run_config=run_config(OP, {"source_tables": [table]}),
                                             tags=days(0, 2))
    assert f"Value at path root:ops:{OP}:config:source_tables[0] not in enum type SourceTable got {table}" in \
        str(refused.value)
    assert table_versions(lake) == before


@pytest.mark.parametrize(("config", "says"), [
    ({"rate": -5}, "rate"),
    ({"limit": 0}, "limit"),
    ({"where": "message_id = 'x'; DROP TABLE poison"}, "where"),
    ({"where": "no_such_column = 1"}, "is not a predicate over the columns"),
    ({"group": "nope"}, "--group failure group 'nope': not a group id"),
])
def test_invalid_config_fails_before_touching_any_table_naming_what_is_wrong(lake, config, says):
    before = table_versions(lake)
    with DagsterInstance.ephemeral() as instance:
        result = redrive_job(lake).execute_in_process(
            instance=instance, run_config=run_config(OP, config), tags=days(0, 2), raise_on_error=False)
    assert not result.success
    assert says in failure_text(result)
    assert table_versions(lake) == before


class Crash(Exception):  # noqa: N818 - a simulated death of the run's process
    pass


def test_re_executing_a_run_that_failed_half_way_completes_it_without_moving_anything_twice(
        lake, tmp_path, monkeypatch):
    config = str(write_config(lake, tmp_path / "config.yaml"))
    job = build_reconstructable_job("poison_pipeline_tests.dagster_support", "job_of",
                                    reconstructable_args=(config, redrive_job_name("q")))
    original = Committer.append
    appended: list[int] = []

    def dies_after_one_chunk(self: Committer, table: str, *args: Any, **kwargs: Any) -> Any:
        if table == "inbound":
            if appended:
                raise Crash("killed after the first chunk")
            appended.append(1)
        return original(self, table, *args, **kwargs)

    # Two messages of day 2, ten seconds apart: two chunks, so the first run dies between them.
    selected = run_config(OP, {"rate": 0.1, "source_tables": ["poison"]})
    home = tmp_path / "dagster_home"
    home.mkdir()
    with instance_for_test(temp_dir=str(home)) as instance:
        monkeypatch.setattr(Committer, "append", dies_after_one_chunk)
        first = execute_job(job, instance, run_config=selected, tags=days(2, 2))
        monkeypatch.setattr(Committer, "append", original)
        assert not first.success and "killed after the first chunk" in "".join(
            e.step_failure_data.error.to_string() for e in first.all_events if e.is_step_failure)
        assert len(rows(lake, "inbound")) == 1 and len(rows(lake, "poison")) == 4  # half done: day 2 not removed
        # As the UI re-executes: with the parent run's config and tags (its days).
        again = execute_job(job, instance, run_config=selected, tags=days(2, 2),
                            reexecution_options=ReexecutionOptions.from_failure(first.run_id, instance))
        assert again.success
        assert instance.get_run_by_id(again.run_id).root_run_id == first.run_id
        # Re-executed once more after it completed, the same redrive moves nothing.
        third = execute_job(job, instance, run_config=selected, tags=days(2, 2),
                            reexecution_options=ReexecutionOptions(first.run_id, step_selection=[OP]))
        assert third.success
    where = places(lake)
    assert where["d2-withdrawal"] == where["d2-refund"] == ["inbound"]
    assert sorted(r["message_id"] for r in rows(lake, "inbound")) == ["d2-refund", "d2-withdrawal"]
    [action] = list_actions(lake, "q")
    assert action.action_id == run_redrive_id(first.run_id)
    assert action.state == DONE and action.counts["moved"] == 2
    assert conservation(QueueTables.of(lake, "q")).accounted == 6


def test_a_redrive_and_a_cycle_of_the_same_queue_launched_together_run_one_after_the_other(spark, lake, tmp_path):
    gate, log = tmp_path / "gate", tmp_path / "calls.jsonl"
    gate.touch()
    assert not enqueue(lake, "q", [{"message_id": "slow", "message_type": "t",
                                    "body": {"hold_while": str(gate), "log": str(log)}}]).refused
    defs = build_definitions(lake)
    results: dict[str, Any] = {}

    def launch(name: str, **kwargs: Any) -> None:
        with DagsterInstance.ephemeral() as instance:
            results[name] = defs.resolve_job_def(name).execute_in_process(
                instance=instance, raise_on_error=False, **kwargs)

    cycle = threading.Thread(target=launch, args=(job_name("q", "inbound"),), kwargs={"run_config": QUIET})
    redrive = threading.Thread(target=launch, args=(redrive_job_name("q"),),
                               kwargs={"run_config": QUIET, "tags": days(0, 2)})
    cycle.start()
    try:
        deadline = time.monotonic() + 120
        while not read_lines(log):  # the cycle holds the queue's lease and is delivering
            assert time.monotonic() < deadline
            time.sleep(0.1)
        before = table_versions(lake)
        redrive.start()
        time.sleep(3)
        assert redrive.is_alive() and table_versions(lake) == before  # waiting for the lease
    finally:
        gate.unlink()
        cycle.join()
        redrive.join()
    assert results[job_name("q", "inbound")].success and results[redrive_job_name("q")].success
    for result in results.values():
        assert result.dagster_run.tags[QUEUE_TAG] == "q"
    where = places(lake)
    assert all(len(found) == 1 for found in where.values()), where
    assert where["slow"] == ["processed:processed"]
    assert all(where[f"d{i}-{kind}"] == ["inbound"] for i in range(3) for kind in ("withdrawal", "refund"))
    assert conservation(QueueTables.of(lake, "q")).accounted == 7
    assert find_action(QueueTables.of(lake, "q"), f"{run_redrive_id(results[redrive_job_name('q')].run_id)}--poison")


@pytest.mark.e2e
def test_an_asset_backfill_over_two_days_launches_one_run_that_redrives_exactly_those_days(
        lake, tmp_path, monkeypatch):
    """Through Dagster's own backfill daemon code: the single-run policy makes the range one run."""
    monkeypatch.setenv("POISON_PIPELINE_CONFIG", str(write_config(lake, tmp_path / "config.yaml")))
    home = tmp_path / "dagster_home"
    home.mkdir()
    target = ModuleTarget(module_name="poison_pipeline.definitions", attribute="defs", working_directory=None,
                          location_name="poison_pipeline")
    with instance_for_test(temp_dir=str(home), synchronous_run_launcher=True,
                           synchronous_run_coordinator=True) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:
        backfill = PartitionBackfill.from_asset_partitions(
            backfill_id="redrive-two-days", asset_graph=workspace.create_request_context().asset_graph,
            partition_names=[day(0), day(1)], asset_selection=[redrive_asset_key("q")],
            backfill_timestamp=time.time(), tags={USER_TAG: "erin"}, dynamic_partitions_store=instance,
            all_partitions=False, title=None, description=None, run_config=None)
        instance.add_backfill(backfill)
        deadline = time.monotonic() + 120
        while instance.get_backfill(backfill.backfill_id).status == BulkActionStatus.REQUESTED:
            assert time.monotonic() < deadline
            list(execute_backfill_iteration(workspace, logging.getLogger("backfill")))
        runs = instance.get_runs(RunsFilter(tags={BACKFILL_ID_TAG: backfill.backfill_id}))
        assert instance.get_backfill(backfill.backfill_id).status == BulkActionStatus.COMPLETED_SUCCESS
    [run] = runs
    assert run.status == DagsterRunStatus.SUCCESS
    assert (run.tags[ASSET_PARTITION_RANGE_START_TAG], run.tags[ASSET_PARTITION_RANGE_END_TAG]) == (day(0), day(1))
    where = places(lake)
    assert sorted(m for m, found in where.items() if found == ["inbound"]) == [
        "d0-refund", "d0-withdrawal", "d1-refund", "d1-withdrawal"]
    assert where["d2-withdrawal"] == where["d2-refund"] == ["poison"]
    assert {(a.actor, a.run_id) for a in list_actions(lake, "q")} == {("erin", run.run_id)}


def test_a_ramp_from_the_redrive_asset_sends_its_first_step_and_records_its_progress(lake):
    config = {"source_tables": ["poison"], "ramp": ["1", "all"], "id": "ramp-d"}
    with DagsterInstance.ephemeral() as instance:
        preview = redrive_job(lake).execute_in_process(
            instance=instance, run_config=run_config(OP, {**config, "dry_run": True}), partition_key=day(1))
        assert previewed(preview)["ramp_steps"] == [1, 1]
        result = redrive_job(lake).execute_in_process(
            instance=instance, run_config=run_config(OP, config), partition_key=day(1))
    assert result.success
    ramp = metadata(result)["ramp"]
    assert (ramp["ramp_id"], ramp["state"], ramp["step"], ramp["sent"], ramp["selected"]) == ("ramp-d", "running",
                                                                                              1, 1, 2)
    assert sorted(m for m, p in places(lake).items() if p == ["inbound"]) == ["d1-refund"]
    assert find_action(QueueTables.of(lake, "q"), "ramp-d").state != DONE  # the queue's cycles go on with it


def test_a_redrive_run_materializes_the_failure_tables_it_changed_with_their_health(lake):
    """The failure tables' pages are current after a redrive: each table it changed is materialized
    (a change of it, as a cycle's); a dry run materializes nothing and observes the redrive asset."""
    with DagsterInstance.ephemeral() as instance:
        dry = redrive_job(lake).execute_in_process(
            instance=instance, run_config=run_config(OP, {"dry_run": True}), tags=days(1, 1))
        assert dry.success and [o.asset_key for o in dry.asset_observations_for_node(OP)] == [redrive_asset_key("q")]
        assert not dry.get_asset_materialization_events()
        result = redrive_job(lake).execute_in_process(instance=instance, run_config=QUIET, tags=days(1, 1))
    assert result.success
    materialized = {e.asset_key.path[-1]: {k: v.value for k, v in
                                           e.step_materialization_data.materialization.metadata.items()}
                    for e in result.get_asset_materialization_events()}
    # quarantine and dead_letter did not change
    assert set(materialized) == {"poison", "redrive"}
    poison = materialized["poison"]
    # d1's two left poison; d2's two are still there, in one group.
    assert (poison["rows"], poison["failed_messages"], poison["depth_poison"], poison["depth_inbound"]) == (2, 2, 2, 2)
    assert poison["depth_quarantine"] == 2 and poison["failed_last_hour"] == 0  # they failed days ago
    assert not result.asset_observations_for_node(OP)
