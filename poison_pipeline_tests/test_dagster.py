"""The Dagster surface: generated assets, lineage, jobs, and real in-process runs (SPEC section 9)."""

from __future__ import annotations

import subprocess
import sys

from dagster import AssetKey, DagsterInstance

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import job_name
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import places, queue, send

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def test_assets_show_the_message_flow(make_declaration):
    defs = build_definitions(make_declaration(queue(max_retry_cycles=2)))
    graph = defs.resolve_asset_graph()
    key = lambda t: AssetKey(["q", t])  # noqa: E731
    assert graph.get(key("retry_1")).parent_keys == {key("inbound")}
    assert graph.get(key("retry_2")).parent_keys == {key("retry_1")}
    assert graph.get(key("poison")).parent_keys == {key("inbound"), key("retry_1"), key("retry_2")}
    assert key("poison") in graph.get(key("quarantine")).parent_keys
    assert key("inbound") in graph.get(key("dead_letter")).parent_keys
    assert graph.get(key("inbound")).group_name == "q"
    assert {"spark", "delta"} <= set(graph.get(key("inbound")).kinds)
    sensors = {s.name for s in defs.get_repository_def().sensor_defs}
    assert {"q__inbound_sensor", "q__retry_1_sensor", "q__retry_2_sensor", "q__poison_sensor"} <= sensors


def test_loading_definitions_starts_no_spark():
    code = ("import sys; import poison_pipeline.definitions as d; "
            "from pyspark.sql import SparkSession; sys.exit(SparkSession.getActiveSession() is not None)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_cycle_run_materializes_with_numeric_metadata(spark, make_declaration):
    declaration = make_declaration(queue(receive_error_handling="move"))
    send(declaration, {"ok": {}, "bad": {"fail": True}})
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(job_name("q", "inbound")).execute_in_process(
            instance=instance, run_config=QUIET)
    assert result.success
    [event] = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()}
    assert metadata["processed"] == 1 and metadata["moved"] == 1 and metadata["attempts"] == 3
    assert metadata["duration_s"] > 0 and metadata["oldest_age_s"] >= 0
    assert places(declaration) == {"ok": ["processed:processed"], "bad": ["retry_1"]}


def test_a_run_on_a_disabled_queue_processes_nothing_and_says_why(spark, make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"ok": {}})
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "database maintenance")
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(job_name("q", "inbound")).execute_in_process(
            instance=instance, run_config=QUIET)
    [event] = result.get_asset_materialization_events()
    skipped = event.step_materialization_data.materialization.metadata["skipped"].value
    assert "disabled: database maintenance" in skipped
    assert places(declaration) == {"ok": ["inbound"]}
