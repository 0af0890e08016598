"""Outage detection on real Spark and Delta (SPEC section 5 "outage detection", section 6 step 1):
a run of recoverable failures stops the cycle, charges nothing and disables the queue."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.control import QUEUE_DISABLED, queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import attempts_of, places, rows

HANDLER = "poison_pipeline_tests.recording_handlers:recording"
UNFIXABLE = "poison_pipeline_tests.handlers:Unfixable"


def declare(make_declaration, **policy: Any):
    # One attempt per message: a run of failed messages is then also a run of failed attempts.
    base = {"receive_retry_count": 0, "max_retry_cycles": 1, "retry_cycle_delay": 0,
            "receive_error_handling": "move"}
    return make_declaration({"q": {"handler": HANDLER, "policy": {**base, **policy}}})


class Lake:
    """One test's messages: `down` ones fail while the flag file exists."""

    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "deliveries.jsonl"
        self.flag = tmp_path / "inventory-db-down"
        self.flag.touch()

    def down(self, message_id: str) -> dict[str, Any]:
        return self.record(message_id, down_if=str(self.flag))

    def record(self, message_id: str, **body: Any) -> dict[str, Any]:
        return {"message_id": message_id, "message_type": "test", "body": {"log": str(self.log), **body}}

    def attempted(self) -> list[str]:
        return list(dict.fromkeys(line["id"] for line in read_lines(self.log)))


def put(declaration, records: list[dict[str, Any]]) -> None:
    # One enqueue is one file, so one Spark partition that keeps this order.
    result = enqueue(declaration, "q", records)
    assert not result.refused, result.refused


def disabled_events(declaration) -> list[dict[str, Any]]:
    return [e for e in rows(declaration, "events") if e["kind"] == QUEUE_DISABLED]


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path)


def test_an_outage_stops_the_cycle_charges_nothing_and_disables_the_queue(spark, make_declaration, lake):
    declaration = declare(make_declaration)
    down = [f"d{i}" for i in range(1, 9)]
    put(declaration, [lake.record("ok1"), lake.record("ok2"), *(lake.down(m) for m in down)])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"processed": 2, "outage": 8, "messages": 10, "attempts": 2 + 5}
    assert lake.attempted() == ["ok1", "ok2", *down[:5]], "the cycle stops after 5 failed messages"
    where = places(declaration)
    assert where["ok1"] == where["ok2"] == ["processed:processed"]
    waiting = {r["message_id"]: r for r in rows(declaration, "inbound")}
    assert set(waiting) == set(down)
    for message_id in down:
        row = waiting[message_id]
        assert (row["abort_count"], row["total_abort_count"], row["move_count"]) == (0, 0, 0), message_id
    for message_id in down[:5]:
        [attempt] = attempts_of(declaration, message_id)
        assert attempt["outcome"] == "outage" and attempt["error_message"] == "inventory database down"
    for message_id in down[5:]:
        assert attempts_of(declaration, message_id) == []
    tables = QueueTables.of(declaration, "q")
    state = queue_state(tables)
    assert not state.enabled and "outage" in state.reason
    [event] = disabled_events(declaration)
    assert "outage" in event["reason"] and event["table"] == "inbound"

    skipped = run_cycle(spark, declaration, "q", "inbound")

    assert skipped.skipped and "disabled" in skipped.skipped and not skipped.counts
    assert len(rows(declaration, "attempts")) == 7 and set(places(declaration)) == {"ok1", "ok2", *down}

    lake.flag.unlink()  # the database is back
    assert set_enabled(tables, True, actor="operator", reason="inventory database restored")
    recovered = run_cycle(spark, declaration, "q", "inbound")

    assert recovered.counts == {"processed": 8, "messages": 8, "attempts": 8}
    processed = Counter(r["message_id"] for r in rows(declaration, "processed") if r["disposition"] == "processed")
    assert processed == Counter({m: 1 for m in ["ok1", "ok2", *down]}), "each processed exactly once"
    for message_id in down:
        successes = [a for a in attempts_of(declaration, message_id) if a["outcome"] == "success"]
        assert len(successes) == 1, message_id
    assert rows(declaration, "inbound") == [] and len(disabled_events(declaration)) == 1


def test_unrecoverable_failures_do_not_count_toward_the_streak(spark, make_declaration, lake):
    declaration = declare(make_declaration, unrecoverable={"exceptions": [UNFIXABLE]})
    put(declaration, [*(lake.down(f"d{i}") for i in range(1, 5)), lake.record("u1", unfixable=True),
                      lake.down("d5"), lake.down("d6"), lake.record("ok")])

    report = run_cycle(spark, declaration, "q", "inbound")

    # u1 neither tripped the detector (5th failure in a row) nor reset it: d5 did trip it.
    assert lake.attempted() == ["d1", "d2", "d3", "d4", "u1", "d5"]
    assert report.counts == {"outage": 7, "poisoned": 1, "messages": 8, "attempts": 6}
    assert places(declaration)["u1"] == ["poison"]
    [poisoned] = rows(declaration, "poison")
    assert poisoned["total_abort_count"] == 1
    assert {r["message_id"] for r in rows(declaration, "inbound")} == {"d1", "d2", "d3", "d4", "d5", "d6", "ok"}
    assert not queue_state(QueueTables.of(declaration, "q")).enabled


def test_a_success_resets_the_streak(spark, make_declaration, lake):
    declaration = declare(make_declaration)
    put(declaration, [*(lake.down(f"a{i}") for i in range(4)), lake.record("ok"),
                      *(lake.down(f"b{i}") for i in range(4))])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"moved": 8, "processed": 1, "messages": 9, "attempts": 9}
    assert queue_state(QueueTables.of(declaration, "q")).enabled and disabled_events(declaration) == []
    assert all(r["total_abort_count"] == 1 for r in rows(declaration, "retry_1"))


def test_failures_that_do_not_point_at_a_dependency_neither_count_nor_reset(spark, make_declaration, lake):
    # ValueError is not in the default policy.outage_errors (ConnectionError, TimeoutError, HandlerTimeout).
    declaration = declare(make_declaration)
    put(declaration, [*(lake.down(f"d{i}") for i in range(1, 4)), *(lake.record(f"v{i}", fail=True) for i in range(3)),
                      lake.down("d4"), lake.down("d5"), lake.record("ok")])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert lake.attempted() == ["d1", "d2", "d3", "v0", "v1", "v2", "d4", "d5"]
    assert report.counts == {"outage": 6, "moved": 3, "messages": 9, "attempts": 8}
    assert {r["message_id"]: r["total_abort_count"] for r in rows(declaration, "retry_1")} == {
        "v0": 1, "v1": 1, "v2": 1}, "their own failures are charged as usual"
    assert not queue_state(QueueTables.of(declaration, "q")).enabled


@pytest.mark.parametrize("policy", [{"outage_threshold": 0}, {"outage_errors": []}], ids=["threshold-0", "no-errors"])
def test_detection_can_be_turned_off(spark, make_declaration, lake, policy):
    declaration = declare(make_declaration, **policy)
    put(declaration, [lake.down(f"d{i}") for i in range(7)])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"moved": 7, "messages": 7, "attempts": 7}
    assert queue_state(QueueTables.of(declaration, "q")).enabled and disabled_events(declaration) == []


def test_each_partition_detects_on_its_own_and_the_cycle_raises_one_event(spark, make_declaration, lake):
    # Through Spark: a small cycle is one partition, delivered by one worker.
    declaration = declare(functools.partial(make_declaration, small_cycles={"max_messages": 0}))
    # Two enqueues are two files, which Spark reads as two partitions (tasks).
    put(declaration, [lake.down(f"a{i}") for i in range(7)])
    put(declaration, [lake.down(f"b{i}") for i in range(7)])

    report = run_cycle(spark, declaration, "q", "inbound")

    per_partition: dict[int, set[str]] = defaultdict(set)
    for line in read_lines(lake.log):
        per_partition[line["partition"]].add(line["id"])
    assert len(per_partition) == 2
    assert all(len(ids) == 5 for ids in per_partition.values()), per_partition
    assert report.counts == {"outage": 14, "messages": 14, "attempts": 10}
    assert all(r["total_abort_count"] == 0 for r in rows(declaration, "inbound"))
    assert len(disabled_events(declaration)) == 1


def test_faulted_messages_of_one_cycle_raise_one_event(spark, make_declaration, lake):
    declaration = declare(make_declaration, max_retry_cycles=0, receive_error_handling="fault")
    put(declaration, [lake.record("f1", fail=True), lake.record("ok"), lake.record("f2", fail=True),
                      lake.record("f3", fail=True)])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"faulted": 3, "processed": 1, "messages": 4, "attempts": 4}
    [event] = disabled_events(declaration)
    assert "3 message(s)" in event["reason"] and all(m in event["reason"] for m in ("f1", "f2", "f3"))
    assert {r["message_id"] for r in rows(declaration, "inbound")} == {"f1", "f2", "f3"}
    assert not queue_state(QueueTables.of(declaration, "q")).enabled


def test_an_outage_uncharges_held_messages_of_conversations_it_would_end(spark, make_declaration, lake):
    declaration = declare(make_declaration, max_retry_cycles=0, ordering="conversation",
                          on_conversation_poison="end_conversation")
    put(declaration, [{**(lake.down(f"c{c}-s1") if s == 1 else lake.record(f"c{c}-s2")),
                       "conversation_id": f"c{c}", "sequence_number": s} for c in range(6) for s in (1, 2)])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert not queue_state(QueueTables.of(declaration, "q")).enabled
    assert rows(declaration, "conversations") == []
    assert rows(declaration, "dead_letter") == [], "nothing may leave on a cycle an outage stopped"
    assert report.counts.get("ended", 0) == 0
    assert len(rows(declaration, "inbound")) == 12


def test_one_message_alone_cannot_trip_the_outage(spark, make_declaration, lake):
    declaration = declare(make_declaration, receive_retry_count=5)
    put(declaration, [lake.down("bad"), lake.record("ok1"), lake.record("ok2")])

    run_cycle(spark, declaration, "q", "inbound")

    assert queue_state(QueueTables.of(declaration, "q")).enabled
    where = places(declaration)
    assert where["ok1"] == where["ok2"] == ["processed:processed"]
    assert where["bad"] == ["retry_1"] and rows(declaration, "retry_1")[0]["total_abort_count"] == 6
