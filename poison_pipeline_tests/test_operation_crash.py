"""Kill -9 at every commit point of a redrive, an edit, a purge and an undo (of each kind it undoes,
by each of its two paths), then the same command again: nothing lost, nothing duplicated, the
conservation line balances, every action ends in the actions ledger once, in its final state, and
the command answers as if it had never been interrupted.

The commit points are not listed by hand from the code: `operation_process` counts those the
uninterrupted command makes, and `test_the_commit_points_are_the_ones_the_kills_cover` fails when
that census differs from COMMITS below. A commit point added to an operation is therefore noticed
there, and once it is added to COMMITS the kill test covers it too.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline.domain.declaration import Declaration, parse_declaration
from poison_pipeline.operations.actions import list_actions
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import edit_message
from poison_pipeline.operations.purge import purge_table
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.storage.tables import ACTIONS, PLANS, PURGED, QueueTables
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.operation_process import run_forked, run_operation
from poison_pipeline_tests.support import kill_sample, places, rows

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 0, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "outage_threshold": 0}
FAILED = {"db-0", "db-1", "db-2", "own-1"}
WITHDRAWALS = {"message_type": "withdrawal"}
FIXED_BODY = json.dumps({"fixed": True})
MONTH = timedelta(days=31)


def _declaration(root: Path) -> Declaration:
    # A short lease expiry: the command run again after a kill -9 soon takes the dead holder's lease.
    return parse_declaration({"lake_root": str(root), "spark": SPARK.model_dump(), "lease": {"expiry": "1s"},
                              "queues": {"q": {"handler": RECORDING, "policy": POLICY},
                                         "other": {"handler": RECORDING, "policy": POLICY}}})


@dataclass(frozen=True)
class Scenario:
    operation: str
    args: dict[str, Any]
    states: dict[str, str]  # every action in q's ledger once the command has completed, and its state
    prepare: Callable[[Any, Declaration, datetime], None] = lambda spark, declaration, at: None
    received: frozenset[str] = frozenset(FAILED)
    last_answers_done: str = ""  # killed after its last commit, the rerun says this (already_done...)


def _enqueue_new(declaration: Declaration) -> None:
    assert not enqueue(declaration, "q", [{"message_id": "new-1", "message_type": "t", "body": {}}]).refused


def _redriven_then_processed(spark, declaration: Declaration, at: datetime) -> None:
    """r1 leaves db-0 due now and db-1, db-2 later; a cycle then processes db-0 (and new-1)."""
    redrive_table(declaration, "q", "poison", Selection(**WITHDRAWALS), rate=0.05, redrive_id="r1", now=at)
    _enqueue_new(declaration)
    run_cycle(spark, declaration, "q", "inbound", now=at + timedelta(seconds=1))


def _purged(spark, declaration: Declaration, at: datetime) -> None:
    purge_table(declaration, "q", "poison", "30d", Selection(**WITHDRAWALS), purge_id="p1", now=at + MONTH)


def _purged_twice(spark, declaration: Declaration, at: datetime) -> None:
    _purged(spark, declaration, at)
    purge_table(declaration, "q", "poison", "30d", Selection(message_type="refund"), purge_id="p2", now=at + MONTH)


def _edited(spark, declaration: Declaration, at: datetime) -> None:
    edit_message(declaration, "db-0", FIXED_BODY.encode(), edit_id="e1")


def _edited_then_enqueued(spark, declaration: Declaration, at: datetime) -> None:
    _edited(spark, declaration, at)
    _enqueue_new(declaration)


def _undo(action_id: str) -> dict[str, Any]:
    return {"id": action_id}


REDRIVE = {"queue": "q", "source": "poison", "selection": WITHDRAWALS, "id": "r1"}
UNDONE_EDIT = {"e1": "undone", "e1--redrive": "undone", "e1--undo": "done", "e1--redrive--undo": "done"}

SCENARIOS: dict[str, Scenario] = {
    "redrive": Scenario("redrive", {**REDRIVE, "rate": 0.05}, {"r1": "done"}, last_answers_done="already_done"),
    "edit": Scenario("edit", {"message_id": "db-0", "body": FIXED_BODY, "id": "e1"},
                     {"e1": "done", "e1--redrive": "done"}, last_answers_done="already_done"),
    "purge": Scenario("purge", {"queue": "q", "table": "poison", "older_than": "30d", "selection": WITHDRAWALS,
                                "id": "p1"}, {"p1": "done"}, last_answers_done="already_done"),
    "undo redrive at once, compensate": Scenario(
        "undo", _undo("r1"), {"r1": "undone", "r1--undo": "done"},
        lambda spark, declaration, at: redrive_table(declaration, "q", "poison", Selection(**WITHDRAWALS),
                                               redrive_id="r1"),
        last_answers_done="already_undone"),
    "undo redrive, compensate": Scenario(
        "undo", _undo("r1"), {"r1": "undone", "r1--undo": "done"}, _redriven_then_processed,
        FAILED | {"new-1"}, "already_undone"),
    "undo purge, restore": Scenario("undo", _undo("p1"), {"p1": "undone", "p1--undo": "done"}, _purged,
                                    last_answers_done="already_undone"),
    "undo purge, compensate": Scenario("undo", _undo("p1"), {"p1": "undone", "p2": "done", "p1--undo": "done"},
                                       _purged_twice, last_answers_done="already_undone"),
    "undo edit at once, compensate": Scenario("undo", _undo("e1"), UNDONE_EDIT, _edited,
                                              last_answers_done="already_undone"),
    "undo edit, compensate": Scenario("undo", _undo("e1"), UNDONE_EDIT, _edited_then_enqueued,
                                      FAILED | {"new-1"}, "already_undone"),
}


# What each command commits, in order, as `operation_process` labels it (the census checks it).
COMMITS: dict[str, list[str]] = {
    'redrive': [
        'q/actions WRITE Append r1:planned',
        'q/plans WRITE Append',
        'q/inbound WRITE Append txn poison_pipeline:redrive/q/r1@1',
        'q/inbound WRITE Append txn poison_pipeline:redrive/q/r1@3',
        'q/inbound WRITE Append txn poison_pipeline:redrive/q/r1@5',
        'q/poison WRITE Overwrite',
        'q/actions WRITE Overwrite r1:done',
        'q/plans WRITE Overwrite',
    ],
    'edit': [
        'q/actions WRITE Append e1:planned',
        'q/edits WRITE Append txn poison_pipeline:action/e1@1',
        'q/actions WRITE Append e1--redrive:planned',
        'q/plans WRITE Append',
        'q/inbound WRITE Append txn poison_pipeline:redrive/q/e1--redrive@1',
        'q/poison WRITE Overwrite',
        'q/actions WRITE Overwrite e1--redrive:done',
        'q/plans WRITE Overwrite',
        'q/actions WRITE Overwrite e1:done',
    ],
    'purge': [
        'q/actions WRITE Append p1:planned',
        'q/plans WRITE Append',
        'q/purged WRITE Append txn poison_pipeline:action/p1@1',
        'q/poison WRITE Overwrite txn poison_pipeline:removed/p1@1',
        'q/actions WRITE Overwrite p1:done',
        'q/plans WRITE Overwrite',
    ],
    'undo redrive at once, compensate': [
        'q/actions WRITE Append r1--undo:planned',
        'q/poison WRITE Append txn poison_pipeline:undo/r1--undo@1',
        'q/inbound WRITE Overwrite',
        'q/actions WRITE Overwrite r1--undo:done',
        'q/actions WRITE Overwrite r1:undone',
    ],
    'undo redrive, compensate': [
        'q/actions WRITE Append r1--undo:planned',
        'q/poison WRITE Append txn poison_pipeline:undo/r1--undo@1',
        'q/inbound WRITE Overwrite',
        'q/actions WRITE Overwrite r1--undo:done',
        'q/actions WRITE Overwrite r1:undone',
    ],
    'undo purge, restore': [
        'q/actions WRITE Append p1--undo:planned',
        'q/poison RESTORE txn poison_pipeline:restore/p1--undo@1',
        'q/purged RESTORE txn poison_pipeline:restore/p1--undo@1',
        'q/actions WRITE Overwrite p1--undo:done',
        'q/actions WRITE Overwrite p1:undone',
    ],
    'undo purge, compensate': [
        'q/actions WRITE Append p1--undo:planned',
        'q/poison WRITE Append txn poison_pipeline:undo/p1--undo@1',
        'q/purged WRITE Overwrite',
        'q/actions WRITE Overwrite p1--undo:done',
        'q/actions WRITE Overwrite p1:undone',
    ],
    'undo edit at once, compensate': [
        'q/actions WRITE Append e1--undo:planned',
        'q/actions WRITE Append e1--redrive--undo:planned',
        'q/poison WRITE Append txn poison_pipeline:undo/e1--redrive--undo@1',
        'q/inbound WRITE Overwrite',
        'q/actions WRITE Overwrite e1--redrive--undo:done',
        'q/actions WRITE Overwrite e1--redrive:undone',
        'q/actions WRITE Overwrite e1--undo:done',
        'q/actions WRITE Overwrite e1:undone',
    ],
    'undo edit, compensate': [
        'q/actions WRITE Append e1--undo:planned',
        'q/actions WRITE Append e1--redrive--undo:planned',
        'q/poison WRITE Append txn poison_pipeline:undo/e1--redrive--undo@1',
        'q/inbound WRITE Overwrite',
        'q/actions WRITE Overwrite e1--redrive--undo:done',
        'q/actions WRITE Overwrite e1--redrive:undone',
        'q/actions WRITE Overwrite e1--undo:done',
        'q/actions WRITE Overwrite e1:undone',
    ],
}


@pytest.fixture(scope="module")
def base(spark, tmp_path_factory) -> tuple[Path, datetime]:
    """Queue q with four messages in poison: db-0..2 (withdrawals, failed while a dependency was
    down, since fixed) and own-1 (a refund that always fails)."""
    folder = tmp_path_factory.mktemp("crash-base")
    declaration = _declaration(folder / "lake")
    down = folder / "down"
    down.touch()
    records = [{"message_id": f"db-{i}", "message_type": "withdrawal", "body": {"down_if": str(down)}}
               for i in range(3)]
    records.append({"message_id": "own-1", "message_type": "refund", "body": {"fail": True}})
    assert not enqueue(declaration, "q", records).refused
    run_cycle(spark, declaration, "q", "inbound")
    down.unlink()
    for name in declaration.queues:  # every table there: the census counts the commands' own commits
        QueueTables.of(declaration, name).ensure()
    assert {m: p for m, p in places(declaration).items()} == {m: ["poison"] for m in FAILED}
    return folder / "lake", datetime.now(UTC)


@pytest.fixture(scope="module")
def prepared(spark, base, tmp_path_factory) -> Callable[[str], tuple[Path, datetime]]:
    """The lake of a scenario just before its command: prepared once, copied for each kill."""
    lakes: dict[str, Path] = {}
    root, at = base

    def lake_of(name: str) -> tuple[Path, datetime]:
        if name not in lakes:
            lakes[name] = tmp_path_factory.mktemp("crash-scenario") / "lake"
            shutil.copytree(root, lakes[name])
            SCENARIOS[name].prepare(spark, _declaration(lakes[name]), at)
        return lakes[name], at

    return lake_of


def _args(scenario: Scenario, at: datetime) -> dict[str, Any]:
    return {**scenario.args, "now": (at + MONTH).isoformat() if scenario.operation == "purge" else at.isoformat()}


def _run_process(declaration: Declaration, folder: Path, scenario: Scenario, at: datetime,
                 step: int) -> subprocess.CompletedProcess[str]:
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    return run_forked(str(config), scenario.operation, step, _args(scenario, at))


def _copy(prepared: Callable[[str], tuple[Path, datetime]], name: str, tmp_path: Path) -> tuple[Declaration, datetime]:
    lake, at = prepared(name)
    shutil.copytree(lake, tmp_path / "lake")
    return _declaration(tmp_path / "lake"), at


@pytest.fixture(scope="module")
def census(prepared, tmp_path_factory) -> Callable[[str], dict[str, Any]]:
    """What the uninterrupted command answers and commits (run once per scenario, in its own process)."""
    made: dict[str, dict[str, Any]] = {}

    def census_of(name: str) -> dict[str, Any]:
        if name not in made:
            folder = tmp_path_factory.mktemp("crash-census")
            declaration, at = _copy(prepared, name, folder)
            ran = _run_process(declaration, folder, SCENARIOS[name], at, 0)
            assert ran.returncode == 0, ran.stdout + ran.stderr
            made[name] = json.loads(ran.stdout.splitlines()[-1])
        return made[name]

    return census_of


def assert_consistent(declaration: Declaration, scenario: Scenario) -> None:
    """Each message in exactly one place (a waiting or failure table, the processed ledger, the purged
    ledger), none lost, the conservation line balanced, each action once in its final state, no plan
    left behind."""
    where = places(declaration)
    for row in rows(declaration, PURGED):
        where.setdefault(row["message_id"], []).append("purged")
    assert {m: p for m, p in where.items() if len(p) != 1} == {}, "a message in two places"
    assert set(where) == scenario.received, "a message lost (or one from nowhere)"
    line = conservation(QueueTables.of(declaration, "q"))
    assert line.accounted == len(scenario.received), line.line(len(scenario.received))
    recorded = Counter(r["action_id"] for r in rows(declaration, ACTIONS))
    assert {a: n for a, n in recorded.items() if n != 1} == {}, "an action recorded twice"
    assert {a.action_id: a.state for a in list_actions(declaration, "q")} == scenario.states
    assert [r["action_id"] for r in rows(declaration, PLANS)] == [], "a plan left behind"
    work = Path(declaration.lake_root) / "q" / "_work"
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*.parquet")) == [], "a plan file left behind"


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_commit_points_are_the_ones_the_kills_cover(census, name):
    made = census(name)
    assert made["unseen"] == [], "a commit no kill can follow"
    if SCENARIOS[name].operation == "undo":  # each scenario takes the way its name says
        assert made["result"]["how"] == name.rsplit(" ", 1)[1]
    assert made["commits"] == COMMITS[name], (
        f"the commit points of {name!r} changed: update COMMITS[{name!r}] so that the kill test "
        "covers each of them")


KILLS = [(name, step) for name in SCENARIOS for step in range(1, len(COMMITS[name]) + 1)]


def answers_done_from(name: str) -> int:
    """The first step after which the command's own action is recorded in its final state: killed
    there or later (a redrive's or a purge's plan removal comes after it), the rerun answers
    `last_answers_done`; killed earlier, it answers as the uninterrupted command did."""
    scenario = SCENARIOS[name]
    final = f" {scenario.args['id']}:{'undone' if scenario.operation == 'undo' else 'done'}"
    return next(i for i, label in enumerate(COMMITS[name], 1) if label.endswith(final))


@pytest.mark.e2e
@pytest.mark.parametrize("name, step", kill_sample(KILLS, per_group=2))
def test_killed_after_a_commit_point_and_run_again_it_completes_once(prepared, census, tmp_path, name, step):
    scenario = SCENARIOS[name]
    reference = census(name)["result"]
    declaration, at = _copy(prepared, name, tmp_path / "killed")
    killed = _run_process(declaration, tmp_path / "killed", scenario, at, step)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    said = json.loads(killed.stdout.splitlines()[-1])
    assert said == {"killed_after": step, "commit": COMMITS[name][step - 1]}
    # The same command again, once the killed process's lease has expired.
    again = run_operation(declaration, scenario.operation, _args(scenario, at))
    if step >= answers_done_from(name):
        assert again[scenario.last_answers_done], again
    else:
        # Taking the lease from the killed holder fenced every table of the queue (an empty commit
        # each): a plan made only now reads the source a version later than the uninterrupted run did.
        assert (again.get("source_version") or 0) >= (reference.get("source_version") or 0)
        assert _without(again, "source_version") == _without(reference, "source_version")
    assert_consistent(declaration, scenario)


def _without(result: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != key}


CYCLE_FIRST = [(n, s) for n, s in KILLS if SCENARIOS[n].operation != "undo"]


@pytest.mark.e2e
@pytest.mark.parametrize("name, step", kill_sample(CYCLE_FIRST, per_group=1))
def test_killed_then_a_cycle_of_its_queue_completes_it_before_taking_any_message(
        spark, prepared, tmp_path, name, step):
    """Nobody runs the command again: the queue's next cycles (inbound, then poison) find it planned
    and complete it first, so no message is handled while a copy of it sits in a second place."""
    scenario = SCENARIOS[name]
    declaration, at = _copy(prepared, name, tmp_path / "killed")
    killed = _run_process(declaration, tmp_path / "killed", scenario, at, step)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    later = at + MONTH + timedelta(days=1)  # every redriven message is due
    left: dict[str, str] = {}
    abandoned: set[str] = set()
    for table in ("inbound", "poison"):
        report = run_cycle(spark, declaration, "q", table, now=later)
        closed = {*report.interrupted.completed, *report.interrupted.abandoned, *report.interrupted.left}
        assert closed <= set(scenario.states)
        left |= report.interrupted.left
        abandoned |= set(report.interrupted.abandoned)
        where = places(declaration)
        for row in rows(declaration, PURGED):
            where.setdefault(row["message_id"], []).append("purged")
        assert {m: p for m, p in where.items() if len(p) != 1} == {}, f"after the {table} cycle"
        assert set(where) == scenario.received
    line = conservation(QueueTables.of(declaration, "q"))
    assert line.accounted == len(scenario.received), line.line(len(scenario.received))
    assert [r["action_id"] for r in rows(declaration, PLANS)] == [], "a plan left behind"
    states = {a.action_id: a.state for a in list_actions(declaration, "q")}
    assert left == {}
    if abandoned:  # killed before it planned a move: nothing moved, and the cycle closed it
        assert states == {a: "abandoned" for a in abandoned}
    else:
        assert states == scenario.states
