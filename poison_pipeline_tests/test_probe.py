"""An outage that ends by itself: `outage_recovery: probe` tries a few messages of a queue an outage
disabled, charged nothing, and resumes the queue on a success."""

from __future__ import annotations

from typing import Any

import pytest

from poison_pipeline.domain.declaration import DeclarationError
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.control import PROBE_FAILED, QUEUE_RECOVERED, queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
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
