"""Failure groups as the unit of work in Dagster: the `redrive_group` asset of a queue, partitioned by
its failure groups (dynamic partitions its sensor keeps to the groups the failure tables hold); a
partition's run redrives that group from every failure table, a dry run marks nothing."""

from __future__ import annotations

from typing import Any

from dagster import (
    AddDynamicPartitionsRequest,
    BackfillPolicy,
    DagsterInstance,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    build_sensor_context,
)

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import (
    QUEUE_TAG,
    USER_TAG,
    failure_groups_partitions_name,
    failure_groups_sensor_name,
    redrive_group_asset_key,
    redrive_group_job_name,
)
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests import test_dagster_redrive as by_day
from poison_pipeline_tests.dagster_support import QUIET, failure_text, run_config
from poison_pipeline_tests.support import places, table_versions

# The lake of the day-partitioned redrive's tests: two failure groups over three days.
built_lake, lake = by_day.built_lake, by_day.lake
OP = "q__redrive_group"
PARTITIONS = failure_groups_partitions_name("q")


def withdrawal_group(declaration) -> str:
    """The group of the withdrawals: two wait in poison, one went on to quarantine."""
    [group] = {g.id for g in failure_groups(declaration, "q") if set(g.message_types) == {"withdrawal"}}
    return group


def listed(declaration, instance: DagsterInstance, cursor: str | None = None) -> Any:
    """One evaluation of the queue's failure groups sensor, its partition requests applied."""
    sensor = build_definitions(declaration).resolve_sensor_def(failure_groups_sensor_name("q"))
    result = sensor.evaluate_tick(build_sensor_context(instance=instance, cursor=cursor))
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    return result


def launch(declaration, instance: DagsterInstance, group: str, config: dict[str, Any] | None = None,
           **tags: str) -> Any:
    job = build_definitions(declaration).resolve_job_def(redrive_group_job_name("q"))
    return job.execute_in_process(instance=instance, run_config=run_config(OP, config) if config else QUIET,
                                  partition_key=group, tags=tags, raise_on_error=False)


def test_the_group_asset_is_partitioned_by_the_queues_failure_groups_a_run_per_group(lake):
    defs = build_definitions(lake)
    node = defs.resolve_asset_graph().get(redrive_group_asset_key("q"))
    assert isinstance(node.partitions_def, DynamicPartitionsDefinition) and node.partitions_def.name == PARTITIONS
    assert node.backfill_policy == BackfillPolicy.multi_run(1)
    assert defs.resolve_job_def(redrive_group_job_name("q")).tags[QUEUE_TAG] == "q"


def test_the_sensor_lists_each_failure_group_once_and_reads_no_data_while_nothing_changed(lake):
    with DagsterInstance.ephemeral() as instance:
        first = listed(lake, instance)
        assert sorted(instance.get_dynamic_partitions(PARTITIONS)) == sorted(
            {g.id for g in failure_groups(lake, "q")})
        assert len(instance.get_dynamic_partitions(PARTITIONS)) == 2  # withdrawal and refund
        again = listed(lake, instance, first.cursor)
        assert not again.dynamic_partitions_requests
        assert "no failure table of q changed" in again.skip_message
        # A lost cursor reads the tables again and finds every group listed already.
        lost = listed(lake, instance)
        assert not lost.dynamic_partitions_requests and "are listed" in lost.skip_message


def test_a_groups_dry_run_says_what_would_move_marks_nothing_then_the_redrive_moves_it_and_its_partition_goes(lake):
    group = withdrawal_group(lake)
    with DagsterInstance.ephemeral() as instance:
        cursor = listed(lake, instance).cursor
        before = table_versions(lake)
        preview = launch(lake, instance, group, {"dry_run": True})
        assert preview.success and table_versions(lake) == before
        assert not preview.get_asset_materialization_events()
        [observation] = [o for o in preview.asset_observations_for_node(OP)
                         if o.asset_key == redrive_group_asset_key("q")]
        assert observation.partition == group
        seen = {k: v.value for k, v in observation.metadata.items()}
        assert (seen["would_move"], seen["group"], seen["by_group"]) == (3, group, {group: 3})
        run = instance.get_run_by_id(preview.run_id)
        assert run is not None and run.tags["poison_pipeline/dry_run"] == "true"

        result = launch(lake, instance, group, **{USER_TAG: "alice"})
        assert result.success
        [materialized] = [e for e in result.get_asset_materialization_events()
                          if e.asset_key == redrive_group_asset_key("q")]
        assert materialized.partition == group
        assert materialized.step_materialization_data.materialization.metadata["moved"].value == 3
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and (run.tags["poison_pipeline/dry_run"], run.tags["poison_pipeline/actor"]) == (
            "false", "alice")
        where = places(lake)
        assert {m: where[m] for m in where if m.endswith("withdrawal")} == {
            f"d{i}-withdrawal": ["inbound"] for i in range(3)}
        # A run for the group after it left (its partition still listed) moves nothing, marks nothing.
        late = launch(lake, instance, group)
        assert late.success and not late.get_asset_materialization_events()
        assert QueueTables.of(lake, "q").open("inbound").count() == 3
        # The group left every failure table: the sensor takes its partition away; the refunds stay.
        gone = listed(lake, instance, cursor)
        assert [type(r) for r in gone.dynamic_partitions_requests] == [DeleteDynamicPartitionsRequest]
        assert instance.get_dynamic_partitions(PARTITIONS) == sorted({g.id for g in failure_groups(lake, "q")})



def test_a_config_naming_another_group_than_the_partition_is_refused_before_any_table_changes(lake):
    group = withdrawal_group(lake)
    with DagsterInstance.ephemeral() as instance:
        listed(lake, instance)
        before = table_versions(lake)
        result = launch(lake, instance, group, {"group": "0000beef"})
    assert not result.success and table_versions(lake) == before
    assert "the partition is the group" in failure_text(result)
