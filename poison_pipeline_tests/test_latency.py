"""A queue's latency setting: how often its sensors look, and inbound runs that stay taking
arrivals cycle after cycle (engine/stay.py), give way to other work of their queue, and never spin."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from dagster import DagsterInstance, build_sensor_context

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import QUEUE_TAG, job_name
from poison_pipeline.defs.sensors import transmission_sensor, waiting_sensor
from poison_pipeline.domain.declaration import DeclarationError
from poison_pipeline.domain.envelope import parse_envelope
from poison_pipeline.engine.cycle import CycleReport
from poison_pipeline.engine.stay import stay
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import message_rows
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import places, queue, seed, send

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def test_a_staying_run_takes_each_arrival_in_a_cycle_of_its_own_until_its_stay_ends(spark, make_declaration):
    """Each arrival comes while the run waits (a while after the previous cycle ended)."""
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    ended = [threading.Event() for _ in range(3)]

    def cycle() -> CycleReport:
        report = run_cycle(spark, declaration, "q", "inbound")
        next(e for e in ended if not e.is_set()).set()
        return report

    def arrive() -> None:
        for event, later in zip(ended, "bc", strict=False):
            event.wait(10)
            time.sleep(0.3)
            send(declaration, {later: {}})

    arrivals = threading.Thread(target=arrive)
    arrivals.start()
    # Told to give way once the third cycle ended, so that a slow machine cannot run out the stay.
    reports = list(stay(cycle, QueueTables.of(declaration, "q"), "inbound", seconds=120,
                        give_way=ended[2].is_set))
    arrivals.join()
    assert [r.counts.get("processed") for r in reports] == [1, 1, 1]
    assert places(declaration) == {m: ["processed:processed"] for m in "abc"}


def test_a_staying_run_gives_way_at_once_to_other_work_of_its_queue(spark, make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    def never() -> CycleReport:
        raise AssertionError("a run told to give way ran a cycle")

    reports = list(stay(never, QueueTables.of(declaration, "q"), "inbound", seconds=5, give_way=lambda: True))
    assert reports == []
    assert places(declaration) == {"a": ["inbound"]}


def test_a_staying_run_of_a_disabled_queue_waits_for_a_change_instead_of_cycling(spark, make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "maintenance")
    reports = list(stay(lambda: run_cycle(spark, declaration, "q", "inbound"), QueueTables.of(declaration, "q"),
                        "inbound", seconds=1.5, give_way=lambda: False))
    assert len(reports) == 1 and "disabled" in (reports[0].skipped or "")
    assert places(declaration) == {"a": ["inbound"]}


def test_a_message_due_later_is_taken_when_it_comes_due_without_any_commit(spark, make_declaration):
    """As a redrive at a rate leaves its messages in the inbound, each due at its own time."""
    declaration = make_declaration(queue())
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    due = datetime.now(UTC) + timedelta(seconds=1)
    envelope = parse_envelope({"message_id": "later", "message_type": "test", "body": {}}, due)
    seed(tables, "inbound", message_rows([envelope], "b-later", due))
    reports: list[CycleReport] = []
    for report in stay(lambda: run_cycle(spark, declaration, "q", "inbound"), QueueTables.of(declaration, "q"),
                       "inbound", seconds=120, give_way=lambda: bool(reports)):
        reports.append(report)
    assert [r.counts.get("processed") for r in reports] == [1]
    assert places(declaration) == {"later": ["processed:processed"]}


def test_a_staying_inbound_run_materializes_once_per_cycle(spark, make_declaration):
    declaration = make_declaration({"q": {**queue()["q"], "latency": {"stay": "4s"}}})
    send(declaration, {"a": {}})
    defs = build_definitions(declaration)

    def arrive() -> None:  # once the run's first cycle took `a`
        while "processed:processed" not in places(declaration).get("a", []):
            time.sleep(0.1)
        send(declaration, {"b": {}})

    arrival = threading.Thread(target=arrive)
    arrival.start()
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(job_name("q", "inbound")).execute_in_process(instance=instance, run_config=QUIET)
    arrival.join()
    assert result.success
    processed = [e.step_materialization_data.materialization.metadata["processed"].value
                 for e in result.get_asset_materialization_events()
                 if e.step_materialization_data.materialization.asset_key.path == ["q", "inbound"]]
    assert processed == [1, 1]
    assert places(declaration) == {"a": ["processed:processed"], "b": ["processed:processed"]}


@pytest.mark.parametrize("latency, table, interval", [
    ({}, "inbound", 29), ({}, "retry_1", 59), ({}, "poison", 59), ({}, "transmission", 29),
    ({"look_every": "5s"}, "inbound", 4), ({"look_every": "5s"}, "retry_1", 4), ({"look_every": "2m"}, "poison", 119),
])
def test_sensors_look_as_often_as_the_queue_asks(make_declaration, latency, table, interval):
    """An interval a second short of the wanted one: the daemon's 5 s loop then evaluates on time."""
    declaration = make_declaration({"q": {**queue()["q"], "latency": latency}})
    sensor = (transmission_sensor(declaration, "q") if table == "transmission"
              else waiting_sensor(declaration, "q", table))
    assert sensor.minimum_interval_seconds == interval


@pytest.mark.parametrize("latency, said", [
    ({"look_every": "2s"}, "queues.q.latency.look_every = '2s': sensors look every 5s at the fastest"),
    ({"stay": "2h"}, "queues.q.latency.stay = '2h': stay must be from 0 (one cycle per run) to 1h, not 2:00:00"),
    ({"stay_for": "1m"}, "queues.q.latency.stay_for = '1m': Extra inputs are not permitted"),
])
def test_a_latency_out_of_bounds_is_refused_naming_the_field(make_declaration, latency, said):
    with pytest.raises(DeclarationError) as refused:
        make_declaration({"q": {**queue()["q"], "latency": latency}})
    assert said in str(refused.value)


def test_no_second_run_is_requested_while_one_waits_to_start(make_declaration):
    """It takes what is due when it starts; a second would find nothing, or queue behind a staying run."""
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    sensor = waiting_sensor(declaration, "q", "inbound")
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        first = sensor(build_sensor_context(instance=instance))
        assert len(first.run_requests) == 1
        instance.create_run_for_job(defs.resolve_job_def(job_name("q", "inbound")), tags={QUEUE_TAG: "q"})
        send(declaration, {"b": {}})
        second = sensor(build_sensor_context(instance=instance, cursor=first.cursor))
        assert not second.run_requests
        assert f"a run of {job_name('q', 'inbound')} waits to start" in second.skip_reason.skip_message
