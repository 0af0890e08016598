"""The asset checks of a queue: real cycle runs in Dagster, real Delta tables broken on purpose."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, DagsterInstance, ExecuteInProcessResult
from deltalake import write_deltalake

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import job_name
from poison_pipeline.domain.declaration import AgeLevels, Declaration, DeclarationError
from poison_pipeline.operations.checks import (
    POISON_GROWTH,
    check_conservation,
    check_growth,
    check_oldest_waiting,
    check_one_place,
)
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import places, queue, send

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def _declare(make_declaration: Any, checks: dict[str, Any] | None = None, **policy: Any) -> Declaration:
    queues = queue(**{"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move", **policy})
    if checks is not None:
        queues["q"]["checks"] = checks
    return make_declaration(queues)


def _cycle(declaration: Declaration, instance: DagsterInstance, table: str = "inbound") -> ExecuteInProcessResult:
    result = build_definitions(declaration).resolve_job_def(job_name("q", table)).execute_in_process(
        instance=instance, run_config=QUIET)
    assert result.success
    return result


def _checks(result: ExecuteInProcessResult) -> dict[str, Any]:
    """check 'table:name' -> its evaluation, from this run's events."""
    return {f"{e.asset_key.path[-1]}:{e.check_name}": e for e in result.get_asset_check_evaluations()}


def _meta(evaluation: Any) -> dict[str, Any]:
    return {k: v.value for k, v in evaluation.metadata.items()}


def test_every_check_passes_after_a_cycle_in_the_same_run(spark, make_declaration):
    declaration = _declare(make_declaration)
    send(declaration, {"ok": {}, "ok2": {}, "bad": {"fail": True}})
    with DagsterInstance.ephemeral() as instance:
        result = _cycle(declaration, instance)
    steps = [e.step_key for e in result.all_events if e.is_step_start]
    assert steps == ["q__inbound", "q__checks"]  # the checks step runs once the cycle has committed
    checks = _checks(result)
    assert set(checks) == {"inbound:conservation", "inbound:one_place", "inbound:user_code", "poison:poison_growth",
                           "dead_letter:dead_letter_growth", "inbound:oldest_waiting", "poison:oldest_waiting",
                           "poison:depth", "dead_letter:depth", "quarantine:depth"}
    # The poisoned message is a warning on poison (by default any failed message is) until it leaves.
    failing = {k: e.severity for k, e in checks.items() if not e.passed}
    assert failing == {"poison:depth": AssetCheckSeverity.WARN}, {k: e.description for k, e in checks.items()}
    assert _meta(checks["poison:depth"])["messages"] == 1
    line = _meta(checks["inbound:conservation"])
    # It saw the tables after the cycle: two processed, one poisoned.
    assert line["accepted"] == line["accounted"] == 3
    assert line["ledger_processed"] == 2 and line["poison"] == 1 and line["waiting"] == 0
    assert line["line"].endswith("OK")
    assert checks["inbound:conservation"].severity == AssetCheckSeverity.ERROR
    assert checks["poison:poison_growth"].severity == AssetCheckSeverity.WARN


def test_a_cycle_records_the_queue_s_health_as_numbers_to_plot(spark, make_declaration):
    declaration = _declare(make_declaration)
    send(declaration, {"ok": {}, "bad": {"fail": True}, "bad2": {"fail": True}})
    with DagsterInstance.ephemeral() as instance:
        result = _cycle(declaration, instance)
    [event] = result.get_asset_materialization_events()
    figures = {k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()}
    assert (figures["failed"], figures["processed"], figures["failed_last_hour"]) == (2, 1, 2)
    assert {k: v for k, v in figures.items() if k.startswith("depth_")} == {
        "depth_inbound": 0, "depth_poison": 2, "depth_dead_letter": 0, "depth_quarantine": 0}


def test_a_message_in_two_tables_fails_one_place_and_conservation_naming_it(spark, make_declaration):
    declaration = _declare(make_declaration)
    send(declaration, {"a": {}, "b": {}})
    tables = QueueTables.of(declaration, "q")
    set_enabled(tables, False, "ops", "maintenance")  # the cycle leaves both in inbound
    inbound = tables.open("inbound").to_pyarrow_table()
    copy = schemas.project(inbound.filter(pa.compute.equal(inbound["message_id"], "a")), schemas.DEAD_LETTER,
                           reason="rejected", from_table="inbound", dead_lettered_at=datetime.now(UTC))
    write_deltalake(tables.uri("dead_letter"), copy, mode="append")  # a writer that broke the rule
    with DagsterInstance.ephemeral() as instance:
        checks = _checks(_cycle(declaration, instance))
    one_place = checks["inbound:one_place"]
    assert not one_place.passed and one_place.severity == AssetCheckSeverity.ERROR
    assert _meta(one_place)["in_two_places"] == 1
    assert "a: dead_letter, inbound" in _meta(one_place)["sample"] or "a: inbound, dead_letter" in _meta(
        one_place)["sample"]
    conservation = checks["inbound:conservation"]
    assert not conservation.passed
    terms = _meta(conservation)
    assert terms["accepted"] == 2 and terms["accounted"] == 3 and terms["dead_letter"] == 1
    assert "1 more messages accounted for than were ever accepted" in conservation.description
    assert places(declaration) == {"a": ["inbound", "dead_letter"], "b": ["inbound"]}  # nothing was repaired


def test_a_lost_message_fails_conservation(spark, make_declaration):
    declaration = _declare(make_declaration)
    send(declaration, {"a": {}, "b": {}})
    tables = QueueTables.of(declaration, "q")
    set_enabled(tables, False, "ops", "maintenance")
    tables.open("inbound").delete("message_id = 'b'")
    with DagsterInstance.ephemeral() as instance:
        conservation = _checks(_cycle(declaration, instance))["inbound:conservation"]
    assert not conservation.passed
    assert _meta(conservation)["difference"] == -1
    assert "1 of 2 accepted messages are nowhere" in conservation.description
    assert _meta(conservation)["line"].endswith("MISMATCH")


def test_poison_growth_warns_over_its_threshold_since_the_previous_check(spark, make_declaration):
    declaration = _declare(make_declaration, checks={"poison_growth": 2})
    send(declaration, {f"bad-{i}": {"fail": True} for i in range(3)})
    with DagsterInstance.ephemeral() as instance:
        first = _checks(_cycle(declaration, instance))["poison:poison_growth"]
        assert not first.passed and first.severity == AssetCheckSeverity.WARN
        assert _meta(first)["growth"] == 3 and _meta(first)["threshold"] == 2
        enqueue(declaration, "q", [{"message_id": "bad-3", "message_type": "test", "body": {"fail": True}}])
        second = _checks(_cycle(declaration, instance))["poison:poison_growth"]
    # Measured from the previous evaluation (Dagster's check history): one more since then.
    assert second.passed and _meta(second)["previous"] == 3 and _meta(second)["growth"] == 1
    assert _meta(second)["rows"] == 4


def test_an_old_due_message_on_a_disabled_queue_warns_oldest_waiting(spark, make_declaration):
    declaration = _declare(make_declaration, checks={"oldest_waiting": "1h"})
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    enqueue(declaration, "q", [{"message_id": "old", "message_type": "test", "body": {}}], now=two_hours_ago)
    set_enabled(QueueTables.of(declaration, "q"), False, "ops", "database down")
    with DagsterInstance.ephemeral() as instance:
        checks = _checks(_cycle(declaration, instance))
    oldest = checks["inbound:oldest_waiting"]
    assert not oldest.passed and oldest.severity == AssetCheckSeverity.WARN
    assert _meta(oldest)["oldest_due_age_s"] >= 7200 and "disabled" in oldest.description
    assert checks["poison:oldest_waiting"].passed  # the other waiting tables are fine
    assert checks["inbound:conservation"].passed


def test_a_failure_table_s_depth_turns_yellow_then_red_and_green_once_its_messages_leave(spark, make_declaration):
    declaration = _declare(make_declaration, checks={"poison": {"warn": 1, "error": 3}, "quarantine": None})
    send(declaration, {f"bad-{i}": {"fail": True} for i in range(2)})
    with DagsterInstance.ephemeral() as instance:
        first = _checks(_cycle(declaration, instance))
        assert (first["poison:depth"].passed, first["poison:depth"].severity) == (False, AssetCheckSeverity.WARN)
        assert "2 message(s) in poison (warn at 1, error at 3): at the warn level" in first["poison:depth"].description
        assert first["quarantine:depth"].passed and "no levels" in first["quarantine:depth"].description
        send(declaration, {"bad-2": {"fail": True}})
        second = _checks(_cycle(declaration, instance))["poison:depth"]
        assert (second.passed, second.severity, _meta(second)["messages"]) == (False, AssetCheckSeverity.ERROR, 3)
        assert redrive_table(declaration, "q", "poison", Selection()).moved == 3
        set_enabled(QueueTables.of(declaration, "q"), False, "ops", "the fix is deploying")
        third = _checks(_cycle(declaration, instance))["poison:depth"]
    assert third.passed and _meta(third)["messages"] == 0


def test_two_level_oldest_waiting_errors_past_its_error_level(make_declaration):
    declaration = _declare(make_declaration, checks={"oldest_waiting": {"warn": "15m", "error": "1h"}})
    now = datetime.now(UTC)
    enqueue(declaration, "q", [{"message_id": "old", "message_type": "test", "body": {}}], now=now)
    tables = QueueTables.of(declaration, "q")
    levels = declaration.queue("q").checks.oldest_waiting
    found = [check_oldest_waiting(tables, "inbound", levels, now + timedelta(minutes=m)) for m in (10, 20, 90)]
    assert [(f.passed, f.severity.value) for f in found] == [(True, "error"), (False, "warn"), (False, "error")]
    assert "(warn at 0:15:00, error at 1:00:00): at the error level" in found[2].description


@pytest.mark.parametrize(("checks", "message"), [
    ({"poison_growth": -1}, "queues.q.checks.poison_growth = -1: a growth threshold is a number of messages"),
    ({"oldest_waiting": "0s"}, "queues.q.checks.oldest_waiting.warn = '0s': oldest_waiting must be a positive"),
    ({"oldest_waiting": "soon"}, "queues.q.checks.oldest_waiting.warn = 'soon': 'soon' is not a duration"),
    ({"dead_letter_growht": 5}, "queues.q.checks.dead_letter_growht = 5: Extra inputs are not permitted"),
    ({"quarantine": {"warn": 10, "error": 2}}, "queues.q.checks.quarantine = {'warn': 10, 'error': 2}: error (2) is "
     "below warn (10)"),
    ({"poison": {"warn": 0}}, "queues.q.checks.poison.warn = 0: a level is a number of messages, 1 or more"),
    ({"oldest_waiting": {"warn": "1h", "error": "1m"}}, "error (0:01:00) is below warn (1:00:00)"),
])
def test_check_thresholds_are_validated_with_the_field_and_rule(make_declaration, checks, message):
    with pytest.raises(DeclarationError) as error:
        _declare(make_declaration, checks=checks)
    assert message in str(error.value)


def test_declared_thresholds_and_defaults(make_declaration):
    defaults = _declare(make_declaration).queue("q").checks
    assert (defaults.poison_growth, defaults.dead_letter_growth, defaults.oldest_waiting) == (
        100, 100, AgeLevels(warn=timedelta(hours=1)))
    assert all((defaults.depth(t).warn, defaults.depth(t).error) == (1, None)
               for t in ("poison", "dead_letter", "quarantine"))
    declared = _declare(make_declaration, checks={"dead_letter_growth": 5, "oldest_waiting": "10m"}).queue("q").checks
    assert (declared.poison_growth, declared.dead_letter_growth, declared.oldest_waiting) == (
        100, 5, AgeLevels(warn=timedelta(minutes=10)))


FORWARD = "poison_pipeline_tests.handlers:forwarding"
ACCEPT = "poison_pipeline_tests.handlers:accept"
FAST = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0, "receive_error_handling": "move"}


def test_conservation_balances_across_sends_unsent_sends_and_redrives_between_queues(spark, make_declaration):
    declaration = make_declaration({
        "orders": {"handler": FORWARD, "policy": FAST},
        "shipping": {"handler": ACCEPT, "policy": FAST, "message_types": ["ship"]},
    })
    enqueue(declaration, "orders", [
        {"message_id": "o1", "message_type": "order", "conversation_id": "c1",
         "body": {"sends": [{"to": "shipping", "type": "ship"}]}},
        # shipping does not take "junk" (-8428): the send is dead-lettered in orders, never delivered.
        {"message_id": "o2", "message_type": "order", "conversation_id": "c2",
         "body": {"sends": [{"to": "shipping", "type": "junk"}]}},
        {"message_id": "o3", "message_type": "order", "conversation_id": "c3", "body": {"fail": True}},
    ])
    run_cycle(spark, declaration, "orders", "inbound")
    orders, shipping = QueueTables.of(declaration, "orders"), QueueTables.of(declaration, "shipping")
    assert places(declaration, "orders") == {"o1": ["processed:processed"], "o2": ["processed:processed"],
                                             "orders:o2/1": ["dead_letter"], "o3": ["poison"]}
    assert places(declaration, "shipping") == {"orders:o1/1": ["inbound"]}
    moved = redrive_table(declaration, "orders", "poison", to="shipping")  # o3 leaves orders for shipping
    assert moved.moved == 1
    lines = {q: check_conservation(t) for q, t in (("orders", orders), ("shipping", shipping))}
    assert all(c.passed for c in lines.values()), {q: c.description for q, c in lines.items()}
    assert (lines["orders"].metadata["accepted"], lines["shipping"].metadata["accepted"]) == (3, 2)
    undo_action(declaration, moved.action_id)  # and back
    lines = {q: check_conservation(t) for q, t in (("orders", orders), ("shipping", shipping))}
    assert all(c.passed for c in lines.values()), {q: c.description for q, c in lines.items()}
    assert (lines["orders"].metadata["accepted"], lines["shipping"].metadata["accepted"]) == (4, 1)


def test_a_lake_older_than_the_intake_ledger_gets_an_opening_balance(spark, make_declaration):
    declaration = _declare(make_declaration)
    send(declaration, {"a": {}, "b": {}})
    tables = QueueTables.of(declaration, "q")
    shutil.rmtree(tables.uri("intake"))  # as a lake written before the ledger existed
    first = check_conservation(tables)
    assert first.passed and first.metadata["accepted"] == 2
    send(declaration, {"c": {}})
    assert check_conservation(tables).metadata["accepted"] == 3


def test_a_check_with_nothing_changed_since_its_last_evaluation_loads_no_table(make_declaration, monkeypatch):
    """What a check read is kept until one of the tables it read changes: asked again, it answers
    from its note (a request per table on an object store), and after any commit it reads again."""
    declaration = _declare(make_declaration)
    send(declaration, {"a": {}, "b": {}})
    tables = QueueTables.of(declaration, "q")
    now = datetime.now(UTC)
    first = {"conservation": check_conservation(tables), "one_place": check_one_place(tables),
             "growth": check_growth(tables, POISON_GROWTH, 10, None),
             "oldest": check_oldest_waiting(tables, "inbound", AgeLevels(warn=timedelta(minutes=1)), now)}
    assert first["conservation"].metadata["accepted"] == 2 and first["one_place"].passed

    def no_load(self: QueueTables, table: str) -> Any:
        raise AssertionError(f"{table} loaded though nothing changed")

    with monkeypatch.context() as patch:
        patch.setattr(QueueTables, "open", no_load)
        assert check_conservation(tables) == first["conservation"]
        assert check_one_place(tables) == first["one_place"]
        assert check_growth(tables, POISON_GROWTH, 10, 0) == check_growth(tables, POISON_GROWTH, 10, 0)
        later = check_oldest_waiting(tables, "inbound", AgeLevels(warn=timedelta(minutes=1)), now + timedelta(hours=1))
        # The due time is kept, the age is counted from it at each evaluation.
        assert not later.passed and later.metadata["oldest_due_age_s"] >= 3600
    send(declaration, {"c": {}})
    assert check_conservation(tables).metadata["accepted"] == 3
    assert check_one_place(tables).metadata["ids_checked"] == 3


def test_a_queue_started_afresh_is_checked_afresh(make_declaration):
    """The queue's folder deleted and its tables made again reach the same versions: the kept
    results are for the old tables, and the note of the new ones tells them apart."""
    declaration = _declare(make_declaration)
    send(declaration, {"a": {}, "b": {}})
    tables = QueueTables.of(declaration, "q")
    assert check_conservation(tables).metadata["accepted"] == 2
    # Everything but the kept results, which on a lake on a store stay on this machine.
    folder = Path(declaration.lake_root) / "q"
    for path in [*folder.iterdir(), *(folder / "_work").iterdir()]:
        if path.name not in ("_work", "memo"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    send(declaration, {"x": {}, "y": {}, "z": {}})
    assert check_conservation(tables).metadata["accepted"] == 3
