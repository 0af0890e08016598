"""A declaration changed while messages wait never strands one: a retry subqueue beyond a lowered
max_retry_cycles still drains, and everything that reads the queue's waiting tables reaches it; a
changed handler takes what waited for the old one; a queue no longer declared is shown by status."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import yaml

from poison_pipeline.cli import main
from poison_pipeline.operations import checks as checks_module
from poison_pipeline.operations.checks import check_conservation, check_one_place
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.status import queue_status
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import HANDLER, places, queue, send

POLICY = {"receive_retry_count": 0, "retry_cycle_delay": "1s", "receive_error_handling": "move"}


def test_a_lowered_max_retry_cycles_drains_the_retry_subqueues_beyond_it(spark, make_declaration):
    before = make_declaration(queue(**POLICY, max_retry_cycles=2))
    send(before, {f"m{i}": {"fail": True} for i in range(3)})
    start = datetime.now(UTC)
    run_cycle(spark, before, "q", "inbound", now=start)
    run_cycle(spark, before, "q", "retry_1", now=start + timedelta(seconds=5))
    assert places(before) == {f"m{i}": ["retry_2"] for i in range(3)}
    assert check_conservation(QueueTables.of(before, "q")).passed

    after = make_declaration(queue(**POLICY, max_retry_cycles=1))
    tables = QueueTables.of(after, "q")

    # retry_2 is still one of the queue's waiting tables: status, the checks and cycles reach it.
    assert tables.waiting == ("inbound", "retry_1", "retry_2", "poison")
    status = queue_status(after, "q", start + timedelta(days=1))
    assert status.table("retry_2").rows == 3
    conservation = check_conservation(tables)
    assert conservation.passed and conservation.metadata["waiting"] == 3
    assert check_one_place(tables).passed
    report = run_cycle(spark, after, "q", "retry_2", now=start + timedelta(days=1))
    # Their cycle there, then the final disposition the lowered policy gives them.
    assert report.counts["poisoned"] == 3
    assert places(after) == {f"m{i}": ["poison"] for i in range(3)}

    # Drained, retry_2 leaves the waiting tables; nothing goes there any more.
    drained = QueueTables.of(after, "q")
    assert drained.waiting == ("inbound", "retry_1", "poison")
    send(after, {"n": {"fail": True}})
    run_cycle(spark, after, "q", "inbound", now=start + timedelta(days=1))
    run_cycle(spark, after, "q", "retry_1", now=start + timedelta(days=2))
    assert places(after)["n"] == ["poison"]
    assert check_conservation(drained).passed


def test_a_checks_memo_is_not_answered_under_another_declaration(make_declaration, monkeypatch):
    """The same tables, unchanged, under a declaration that waits in other tables: the answer kept
    under the first is computed again, since which tables hold waiting messages decides it."""
    wide = make_declaration(queue(**POLICY, max_retry_cycles=2))
    narrow = make_declaration(queue(**POLICY, max_retry_cycles=0))
    send(wide, {"a": {}})
    computed: list[tuple[str, ...]] = []
    real = checks_module._conservation

    def counting(tables: QueueTables) -> checks_module.CheckOutcome:
        computed.append(tables.waiting)
        return real(tables)

    monkeypatch.setattr(checks_module, "_conservation", counting)
    assert check_conservation(QueueTables.of(wide, "q")).passed
    assert check_conservation(QueueTables.of(wide, "q")).passed  # kept: nothing changed
    assert check_conservation(QueueTables.of(narrow, "q")).passed
    assert computed == [("inbound", "retry_1", "retry_2", "poison"), ("inbound", "poison")]


def test_status_names_the_messages_of_a_queue_no_longer_declared(spark, make_declaration, tmp_path, capsys):
    """A queue removed (or renamed) while messages wait in it: `status` lists its tables that hold
    them, and says what to do; a declared queue's status is as before."""
    both = make_declaration({**queue(**POLICY, max_retry_cycles=1),
                             "old": {"handler": HANDLER, "policy": {**POLICY, "max_retry_cycles": 1}}})
    records = [{"message_id": f"o{i}", "message_type": "t", "body": {}} for i in range(2)]
    assert not enqueue(both, "old", records).refused
    config = tmp_path / "only_q.yaml"  # "old" removed from the declaration
    config.write_text(yaml.safe_dump({"lake_root": both.lake_root, "queues": queue(**POLICY, max_retry_cycles=1)}))

    assert main(["--config", str(config), "status", "--json"]) == 0
    shown = {s["queue"]: s for s in json.loads(capsys.readouterr().out)["queues"]}
    assert shown["q"]["undeclared"] is None
    old = shown["old"]
    assert {t["table"]: t["rows"] for t in old["tables"]}["inbound"] == 2
    assert "no declared queue names" in old["undeclared"] and "Declare queue 'old' again" in old["undeclared"]
    assert main(["--config", str(config), "status"]) == 0
    assert "old: NOT DECLARED: 2 message(s)" in capsys.readouterr().out


def test_a_changed_handler_takes_the_messages_waiting_for_the_old_one(spark, make_declaration):
    """A fix deployed as another handler: the messages waiting in a retry subqueue go to it at
    their next cycle, with their counts as they were."""
    failing = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:always_fails",
                                      "policy": {**POLICY, "max_retry_cycles": 1}}})
    send(failing, {"a": {}, "b": {}})
    start = datetime.now(UTC)
    run_cycle(spark, failing, "q", "inbound", now=start)
    assert places(failing) == {"a": ["retry_1"], "b": ["retry_1"]}

    fixed = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:accept",
                                    "policy": {**POLICY, "max_retry_cycles": 1}}})
    assert run_cycle(spark, fixed, "q", "retry_1", now=start + timedelta(minutes=1)).counts["processed"] == 2
    assert places(fixed) == {"a": ["processed:processed"], "b": ["processed:processed"]}
    assert check_conservation(QueueTables.of(fixed, "q")).passed
