"""An outage that ends by itself: `outage_recovery: probe` tries a few messages of a queue an outage
disabled, charged nothing, and resumes the queue on a success."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context

from poison_pipeline.defs.alerts import queue_recovered_sensor
from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import PROBE_TAG, alert_job_name, job_name
from poison_pipeline.defs.sensors import decide
from poison_pipeline.domain.alerts import QUEUE_RECOVERED
from poison_pipeline.domain.declaration import DeclarationError
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.control import PROBE_FAILED, queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.dagster_support import QUIET
from poison_pipeline_tests.support import attempts_of, places, rows
from poison_pipeline_tests.test_outage import Lake, declare, put

PROBING = {"outage_threshold": 2, "outage_recovery": "probe", "probe": {"interval": "1m", "messages": 1}}


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(tmp_path)


def events(declaration, kind: str) -> list[dict[str, Any]]:
    return [e for e in rows(declaration, "events") if e["kind"] == kind]


def outage(spark, declaration, lake: Lake, count: int = 6) -> list[str]:
    down = [f"d{i}" for i in range(count)]
    put(declaration, [lake.down(m) for m in down])
    run_cycle(spark, declaration, "q", "inbound")
    assert not queue_state(QueueTables.of(declaration, "q")).enabled
    return down


def charged(declaration, message_id: str) -> tuple[int, int]:
    [row] = [r for r in rows(declaration, "inbound") if r["message_id"] == message_id]
    return row["abort_count"], row["total_abort_count"]


def test_a_probe_keeps_the_queue_disabled_while_the_dependency_is_down_charging_nothing(spark, make_declaration, lake):
    declaration = declare(make_declaration, **PROBING)
    down = outage(spark, declaration, lake)
    tried_before = len(rows(declaration, "attempts"))

    report = run_cycle(spark, declaration, "q", "inbound", probe=True)

    assert report.probe == 1 and report.counts["outage"] == len(down)
    # One message tried (the oldest), uncharged like every other; the queue stays disabled.
    assert len(rows(declaration, "attempts")) == tried_before + 1
    assert all(charged(declaration, m) == (0, 0) for m in down)
    assert set(places(declaration)) == set(down) and all(p == ["inbound"] for p in places(declaration).values())
    state = queue_state(QueueTables.of(declaration, "q"))
    assert not state.enabled and state.reason.startswith("outage suspected")
    [failed] = events(declaration, PROBE_FAILED)
    assert "the outage goes on: d0 failed with" in failed["reason"] and "DependencyDown" in failed["reason"]
    assert len(events(declaration, "queue_disabled")) == 1, "a failed probe raises no second disable"


def test_a_probe_resumes_the_queue_once_the_dependency_answers(spark, make_declaration, lake):
    declaration = declare(make_declaration, **PROBING)
    down = outage(spark, declaration, lake)
    lake.flag.unlink()  # the dependency is back

    report = run_cycle(spark, declaration, "q", "inbound", probe=True)

    assert report.probe == 1 and report.counts["processed"] == 1 and report.counts["outage"] == len(down) - 1
    state = queue_state(QueueTables.of(declaration, "q"))
    assert state.enabled and state.actor == "poison_pipeline" and "probe" in state.reason
    [recovered] = events(declaration, QUEUE_RECOVERED)
    assert "1 of 1 message(s) tried in inbound succeeded" in recovered["reason"]

    # Resumed, the queue's next cycle takes the rest as usual: each message processed once.
    run_cycle(spark, declaration, "q", "inbound")
    assert all(p == ["processed:processed"] for p in places(declaration).values())
    assert all(len([a for a in attempts_of(declaration, m) if a["outcome"] == "success"]) == 1 for m in down)


def test_a_probe_takes_nothing_from_a_queue_an_operator_disabled(spark, make_declaration, lake):
    declaration = declare(make_declaration, **PROBING)
    put(declaration, [lake.record("ok")])
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance window")
    assert run_cycle(spark, declaration, "q", "inbound", probe=True).skipped
    assert places(declaration) == {"ok": ["inbound"]}


def test_a_queue_whose_policy_does_not_probe_waits_for_an_operator(spark, make_declaration, lake):
    declaration = declare(make_declaration, outage_threshold=2)
    down = outage(spark, declaration, lake)
    assert run_cycle(spark, declaration, "q", "inbound", probe=True).skipped
    assert all(charged(declaration, m) == (0, 0) for m in down) and not events(declaration, PROBE_FAILED)


def test_on_an_enabled_queue_a_probe_run_is_a_cycle_as_usual(spark, make_declaration, lake):
    declaration = declare(make_declaration, **PROBING)
    put(declaration, [lake.record(f"ok{i}") for i in range(3)])
    report = run_cycle(spark, declaration, "q", "inbound", probe=True)
    assert report.probe == 0 and report.counts["processed"] == 3


@pytest.mark.parametrize(("probe", "says"), [({"interval": "0s"}, "probe.interval"),
                                             ({"messages": 0}, "probe.messages"),
                                             ({"every": "1m"}, "probe.every")])
def test_a_bad_probe_is_refused_at_load(make_declaration, probe, says):
    with pytest.raises(DeclarationError, match=says.replace(".", r"\.")):
        declare(make_declaration, outage_recovery="probe", probe=probe)


def test_the_inbound_sensor_requests_a_probe_every_interval_while_the_outage_lasts(spark, make_declaration, lake):
    declaration = declare(make_declaration, **PROBING)
    policy = declaration.queue("q").policy
    tables = QueueTables.of(declaration, "q")
    outage(spark, declaration, lake)
    now = datetime.now(UTC)
    first = decide(tables, "inbound", {}, now, policy=policy)
    assert first.run_key is None and "next probe at" in (first.skip or "")
    due = decide(tables, "inbound", first.cursor, now + timedelta(seconds=61), policy=policy)
    assert due.probe and due.run_key is not None and due.run_key.startswith("q/inbound/probe-")
    soon = decide(tables, "inbound", due.cursor, now + timedelta(seconds=90), policy=policy)
    assert soon.run_key is None and "next probe at" in (soon.skip or "")
    assert decide(tables, "inbound", due.cursor, now + timedelta(seconds=122), policy=policy).probe

    # Without the policy (or once enabled), the sensor decides as it always did.
    assert decide(tables, "inbound", {}, now + timedelta(hours=1)).run_key is None
    set_enabled(tables, True, "ops", "back")
    resumed = decide(tables, "inbound", due.cursor, now + timedelta(hours=1), policy=policy)
    assert not resumed.probe and "probed_at" not in resumed.cursor


def test_a_probe_run_in_dagster_resumes_the_queue_and_raises_the_recovery_alert(spark, make_declaration, lake):
    declaration = declare(make_declaration, **PROBING)
    outage(spark, declaration, lake)
    lake.flag.unlink()
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        run = defs.resolve_job_def(job_name("q", "inbound")).execute_in_process(
            instance=instance, run_config=QUIET, tags={PROBE_TAG: "true"})
        assert run.success
        assert queue_state(QueueTables.of(declaration, "q")).enabled
        context = build_sensor_context(instance=instance, cursor=None)
        result = queue_recovered_sensor(declaration, "q")(context)
        assert isinstance(result, SensorResult)
        [request] = result.run_requests
        alert = defs.resolve_job_def(alert_job_name("q", QUEUE_RECOVERED)).execute_in_process(
            run_config={**request.run_config, **QUIET}, tags=request.tags, instance=instance)
        assert alert.success
    # Only a queue that probes has the recovery alert.
    manual = build_definitions(declare(make_declaration, outage_threshold=2)).get_repository_def()
    assert alert_job_name("q", QUEUE_RECOVERED) not in {j.name for j in manual.get_all_jobs()}
