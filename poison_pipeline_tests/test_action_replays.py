"""Operator actions rerun, reused, interrupted and replayed: every message stays in exactly one place.

Each test is one sequence of the issue "Nothing lost, whatever operators do and however long a
process pauses" (its case number in the name), on small cycles delivered without Spark.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable

from poison_pipeline import cli
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import INBOUND, POISON
from poison_pipeline.engine import cycle as cycle_module
from poison_pipeline.operations import edit as edit_module
from poison_pipeline.operations import purge as purge_module
from poison_pipeline.operations import redrive as redrive_module
from poison_pipeline.operations.actions import ABANDONED, DONE, PLANNED, Recorded, find_action
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import EditNotFound, edit_message
from poison_pipeline.operations.purge import purge_table
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import RedriveError, Replacement, redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import UndoError, undo_action
from poison_pipeline.storage.journal import read_entry
from poison_pipeline.storage.tables import PLANS, PURGED, QueueTables
from poison_pipeline.storage.writer import QueueWriter
from poison_pipeline.text.redrive import format_redrive
from poison_pipeline_tests.support import places

HANDLER = "poison_pipeline_tests.handlers:scripted"
# One failed attempt sends a message to poison.
FAILS_ONCE = {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"}


class Killed(Exception):  # noqa: N818 - a process killed at that point
    pass


def no_spark() -> Any:
    raise AssertionError("a small cycle never starts Spark")


def lake(make_declaration: Callable[..., Declaration], *names: str) -> Declaration:
    return make_declaration({name: {"handler": HANDLER, "policy": FAILS_ONCE} for name in names},
                            small_cycles={"max_messages": 1000})


def send(declaration: Declaration, queue: str, bodies: dict[str, dict[str, Any]]) -> None:
    result = enqueue(declaration, queue, [{"message_id": m, "message_type": "t", "body": b} for m, b in bodies.items()])
    assert not result.refused, result.refused


def cycle(declaration: Declaration, queue: str = "q", table: str = INBOUND) -> cycle_module.CycleReport:
    return run_cycle(no_spark, declaration, queue, table)


def purged_ids(declaration: Declaration, queue: str = "q") -> list[str]:
    tables = QueueTables.of(declaration, queue)
    return sorted(tables.open(PURGED).to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist())


def accounted(declaration: Declaration, queue: str = "q") -> int:
    return conservation(QueueTables.of(declaration, queue)).accounted


def kill_after(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, calls: int) -> None:
    """Kill the process right after the `calls`-th call of `owner.name` (it is made, then the kill)."""
    real = getattr(owner, name)
    made = [0]

    def step(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        made[0] += 1
        if made[0] == calls:
            raise Killed(f"killed after {name} #{calls}")
        return result

    monkeypatch.setattr(owner, name, step)


def kill_before(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, calls: int) -> None:
    """Kill the process just before the `calls`-th call of `owner.name` would be made."""
    real = getattr(owner, name)
    made = [0]

    def step(*args: Any, **kwargs: Any) -> Any:
        made[0] += 1
        if made[0] == calls:
            raise Killed(f"killed before {name} #{calls}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, step)


def two_in_poison(declaration: Declaration) -> None:
    send(declaration, "q", {"m1": {"fail": True}, "m2": {"fail": True}})
    cycle(declaration)
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}


def test_case_1_redrive_undo_and_the_same_redrive_again_moves_them_again(make_declaration):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    first = redrive_table(declaration, "q", POISON)
    assert undo_action(declaration, first.action_id).restored == 2
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    again = redrive_table(declaration, "q", POISON)
    assert again.redrive_id != first.redrive_id  # a new invocation is a new action
    assert (again.moved, again.already_done) == (2, False)
    assert places(declaration) == {"m1": [INBOUND], "m2": [INBOUND]}
    assert accounted(declaration) == 2
    # The undone action's own id resumes that action, which is over: nothing moves.
    assert redrive_table(declaration, "q", POISON, redrive_id=first.redrive_id).already_done
    assert places(declaration) == {"m1": [INBOUND], "m2": [INBOUND]}


def test_a_committed_chunk_missing_from_the_target_leaves_the_source_alone(make_declaration, monkeypatch):
    """The mechanism behind case 1: a chunk the target's log shows appended, whose messages are not
    in the target (its append was taken back since), never lets the source rows go."""
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    inbound = QueueTables.of(declaration, "q").open(INBOUND)
    before = inbound.version()
    with monkeypatch.context() as patch:
        kill_before(patch, QueueWriter, "replace_batches", 1)  # appended, not removed from poison yet
        with pytest.raises(Killed):
            redrive_table(declaration, "q", POISON, redrive_id="r1")
    DeltaTable(inbound.table_uri).restore(before)  # the append taken back; its app transaction stays
    with pytest.raises(RedriveError, match="records the chunks of 2 message"):
        redrive_table(declaration, "q", POISON, redrive_id="r1")
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    assert find_action(QueueTables.of(declaration, "q"), "r1").state == PLANNED
    assert accounted(declaration) == 2


def _config(declaration: Declaration, tmp_path: Path) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    return str(config)


def test_case_2_an_id_another_queue_used_is_refused_and_changes_nothing(make_declaration, tmp_path, capsys):
    declaration = lake(make_declaration, "a", "b", "z")
    send(declaration, "a", {"a1": {"fail": True}})
    send(declaration, "b", {"b1": {"fail": True}})
    cycle(declaration, "a")
    cycle(declaration, "b")
    assert redrive_table(declaration, "a", POISON, to="z", redrive_id="fix1").moved == 1
    with pytest.raises(RedriveError, match="'fix1' is already used by an action of queue 'a'"):
        redrive_table(declaration, "b", POISON, to="z", redrive_id="fix1")
    run = ["--config", _config(declaration, tmp_path), "redrive", "b", "--from", POISON, "--to", "z", "--id", "fix1"]
    assert cli.main(run) == cli.EXIT_USAGE
    assert "already used by an action of queue 'a'" in capsys.readouterr().err
    assert places(declaration, "b") == {"b1": [POISON]}
    assert places(declaration, "z") == {"a1": [INBOUND]}
    assert accounted(declaration, "b") == 1
    # Another id goes through: the target's app transactions are the source queue's own.
    assert redrive_table(declaration, "b", POISON, to="z", redrive_id="fix2").moved == 1
    assert places(declaration, "z") == {"a1": [INBOUND], "b1": [INBOUND]}
    assert (accounted(declaration, "a"), accounted(declaration, "b")) == (0, 0)


def test_case_5_a_purge_first_completes_an_interrupted_redrive_and_purges_nothing_it_sent_back(
        make_declaration, monkeypatch):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    with monkeypatch.context() as patch:
        kill_after(patch, Recorded, "record_plan", 1)
        with pytest.raises(Killed):
            redrive_table(declaration, "q", POISON, redrive_id="r1")
    # The redrive may have sent copies already: the purge completes it before it selects anything.
    held = purge_table(declaration, "q", POISON, 0)
    assert (held.purged, held.resumed, held.skipped_held) == (0, ["r1"], 0)
    done = find_action(QueueTables.of(declaration, "q"), "r1")
    assert (done.state, done.counts["moved"], done.counts["skipped_moved_since"]) == (DONE, 2, 0)
    assert cycle(declaration).interrupted.completed == []
    assert purged_ids(declaration) == []
    assert sorted(places(declaration)) == ["m1", "m2"]
    assert all(len(where) == 1 for where in places(declaration).values())
    assert accounted(declaration) == 2
    assert QueueTables.of(declaration, "q").open(PLANS).count() == 0  # no plan left behind


@pytest.mark.parametrize("killed", ["after its plan", "after its ledger rows"])
def test_case_13_a_purge_killed_then_a_redrive_completes_the_purge_first(make_declaration, monkeypatch, killed):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    with monkeypatch.context() as patch:
        if killed == "after its plan":
            kill_after(patch, Recorded, "record_plan", 1)
        else:
            kill_before(patch, QueueWriter, "replace_batches", 1)
        with pytest.raises(Killed):
            purge_table(declaration, "q", POISON, 0, purge_id="p1")
    assert purged_ids(declaration) == ([] if killed == "after its plan" else ["m1", "m2"])
    # The purge came first: the redrive completes it before it selects anything, and finds nothing.
    assert redrive_table(declaration, "q", POISON).moved == 0
    done = find_action(QueueTables.of(declaration, "q"), "p1")
    assert (done.state, done.counts["purged"], done.counts["skipped_moved_since"]) == (DONE, 2, 0)
    assert cycle(declaration).interrupted.completed == []
    assert places(declaration) == {}
    assert purged_ids(declaration) == ["m1", "m2"]
    assert accounted(declaration) == 2


@pytest.mark.parametrize("killed_before", [("append", 2), ("replace_batches", 1)],
                         ids=["its-move-back", "its-removal-from-inbound"])
def test_case_6_an_undo_killed_then_an_enqueue_then_the_undo_again_compensates_whole(make_declaration,
                                                                                     monkeypatch, killed_before):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    redrive_table(declaration, "q", POISON, redrive_id="r1")
    with monkeypatch.context() as patch:
        kill_before(patch, QueueWriter, *killed_before)
        with pytest.raises(Killed):
            undo_action(declaration, "r1")
    send(declaration, "q", {"n1": {}})
    result = undo_action(declaration, "r1")
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 2, [])
    assert places(declaration) == {"m1": [POISON], "m2": [POISON], "n1": [INBOUND]}
    assert accounted(declaration) == 3


def test_case_12_undo_of_a_redrive_into_a_queue_it_created_brings_the_message_back(make_declaration):
    declaration = lake(make_declaration, "qb", "qc")
    send(declaration, "qb", {"m1": {"fail": True}})
    cycle(declaration, "qb")
    done = redrive_table(declaration, "qb", POISON, to="qc")
    assert QueueTables.of(declaration, "qb").exists(POISON)
    assert find_action(QueueTables.of(declaration, "qb"), done.action_id).versions["qc/inbound"]["before"] is None
    result = undo_action(declaration, done.action_id)
    assert (result.restored, result.unrecoverable) == (1, [])
    assert places(declaration, "qb") == {"m1": [POISON]}
    assert places(declaration, "qc") == {}
    assert (accounted(declaration, "qb"), accounted(declaration, "qc")) == (1, 0)


def test_case_14_an_undo_finishes_the_queues_staged_cycle_first(make_declaration, monkeypatch):
    declaration = lake(make_declaration, "q")
    send(declaration, "q", {"m1": {"fail": True}})
    cycle(declaration)
    fixed = {"m1": Replacement(b"{}", ())}
    redrive_table(declaration, "q", POISON, redrive_id="r1", replace=fixed)
    with monkeypatch.context() as patch:
        def killed(*args: Any, **kwargs: Any) -> None:
            raise Killed("killed after staging")
        patch.setattr(cycle_module, "finish_staged", killed)
        with pytest.raises(Killed):
            cycle(declaration)
    assert read_entry(QueueTables.of(declaration, "q"), INBOUND).state == "staged"
    result = undo_action(declaration, "r1")
    assert read_entry(QueueTables.of(declaration, "q"), INBOUND).state == "done"
    assert (result.restored, result.unrecoverable) == (0, ["m1"])
    assert places(declaration) == {"m1": ["processed:processed"]}
    cycle(declaration)
    assert places(declaration) == {"m1": ["processed:processed"]}
    assert accounted(declaration) == 1


def test_a_redrive_and_a_purge_without_an_id_are_new_actions_each_time(make_declaration):
    declaration = lake(make_declaration, "q")
    now = datetime.now(UTC)
    send(declaration, "q", {"m1": {"fail": True}})
    cycle(declaration)
    ids = {redrive_module.redrive_table(declaration, "q", POISON, dry_run=True, now=now).redrive_id for _ in range(2)}
    assert len(ids) == 2
    # After the cycle, however long it took: m1 failed before this moment.
    first = purge_table(declaration, "q", POISON, 0, now=datetime.now(UTC) + timedelta(seconds=1))
    send(declaration, "q", {"m2": {"fail": True}})
    cycle(declaration)
    second = purge_table(declaration, "q", POISON, 0)
    assert first.purge_id != second.purge_id and (first.purged, second.purged) == (1, 1)
    assert accounted(declaration) == 2


def test_a_redrive_killed_before_its_plan_is_closed_abandoned_by_the_next_cycle(make_declaration, monkeypatch):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    tables = QueueTables.of(declaration, "q")
    with monkeypatch.context() as patch:
        kill_before(patch, Recorded, "record_plan", 1)
        with pytest.raises(Killed):
            redrive_table(declaration, "q", POISON, redrive_id="r1")
    assert find_action(tables, "r1").state == PLANNED
    assert cycle(declaration).interrupted.abandoned == ["r1"]
    closed = find_action(tables, "r1")
    assert (closed.state, closed.counts["moved"]) == (ABANDONED, 0)
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    # Its id stays taken: run again, it says so and moves nothing; there is nothing to undo.
    again = redrive_table(declaration, "q", POISON, redrive_id="r1")
    assert (again.already_done, again.abandoned, again.moved) == (True, True, 0)
    assert "was abandoned" in format_redrive(again)
    with pytest.raises(UndoError, match="abandoned"):
        undo_action(declaration, "r1")
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    assert accounted(declaration) == 2


def test_an_edit_killed_before_it_recorded_the_new_body_is_closed_abandoned(make_declaration, monkeypatch):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    with monkeypatch.context() as patch:
        kill_before(patch, edit_module, "_record", 1)
        with pytest.raises(Killed):
            edit_message(declaration, "m1", b'{"fail": false}', queue="q", edit_id="e1")
    assert cycle(declaration).interrupted.abandoned == ["e1"]
    again = edit_message(declaration, "m1", b'{"fail": false}', queue="q", edit_id="e1")
    assert (again.already_done, again.abandoned, again.moved) == (True, True, 0)
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    assert edit_message(declaration, "m1", b'{"fail": false}', queue="q", edit_id="e2").moved == 1


def test_an_edit_completes_an_interrupted_redrive_of_its_message_first(make_declaration, monkeypatch):
    """The redrive sent m1 back and was killed before removing it from poison: an edit of that copy
    would send m1 a second time. The edit completes the redrive first, then finds m1 gone."""
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    with monkeypatch.context() as patch:
        kill_before(patch, redrive_module, "_remove_from_source", 1)
        with pytest.raises(Killed):
            redrive_table(declaration, "q", POISON, redrive_id="r1")
    assert places(declaration) == {"m1": [INBOUND, POISON], "m2": [INBOUND, POISON]}
    with pytest.raises(EditNotFound, match="left q/poison"):
        edit_message(declaration, "m1", b'{"fail": false}', queue="q", source=POISON, edit_id="e1")
    assert find_action(QueueTables.of(declaration, "q"), "r1").state == DONE
    assert places(declaration) == {"m1": [INBOUND], "m2": [INBOUND]}
    assert accounted(declaration) == 2


def test_an_undo_into_another_queue_killed_half_way_is_completed_by_its_queues_next_cycle(
        make_declaration, monkeypatch):
    """The undo held the copies in z's inbound, put the messages back in q's poison and was killed
    before it removed them from z's inbound: q's next cycle completes it, taking z's lease as the
    undo did."""
    declaration = lake(make_declaration, "q", "z")
    two_in_poison(declaration)
    redrive_table(declaration, "q", POISON, to="z", redrive_id="r1")
    send(declaration, "z", {"n1": {}})  # z changed since: the undo compensates
    with monkeypatch.context() as patch:
        kill_before(patch, QueueWriter, "replace_batches", 2)  # the first holds the copies
        with pytest.raises(Killed):
            undo_action(declaration, "r1")
    assert places(declaration, "z") == {"m1": [INBOUND], "m2": [INBOUND], "n1": [INBOUND]}
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    assert cycle(declaration).interrupted.completed == ["r1--undo"]
    assert places(declaration, "z") == {"n1": [INBOUND]}
    assert places(declaration) == {"m1": [POISON], "m2": [POISON]}
    assert (accounted(declaration, "q"), accounted(declaration, "z")) == (2, 1)


def test_an_undo_keeps_a_message_enqueued_while_the_redrive_ran(make_declaration, monkeypatch):
    """An enqueue needs no lease: one that lands between the redrive's append and its `done` record
    is in the inbound version the redrive recorded as "after", and a restore would delete it."""
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    real = redrive_module._remove_from_source

    def enqueue_meanwhile(*args: Any, **kwargs: Any) -> Any:
        send(declaration, "q", {"n1": {}})
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(redrive_module, "_remove_from_source", enqueue_meanwhile)
        redrive_table(declaration, "q", POISON, redrive_id="r1")
    assert places(declaration) == {"m1": [INBOUND], "m2": [INBOUND], "n1": [INBOUND]}
    undo_action(declaration, "r1")
    assert places(declaration) == {"m1": [POISON], "m2": [POISON], "n1": [INBOUND]}
    assert accounted(declaration) == 3


def test_an_undo_of_a_redrive_to_another_queue_completed_after_that_queue_moved_them_on(make_declaration,
                                                                                         monkeypatch):
    """A redrive `--to` killed after its moves, the target's cycle takes the messages on, the source's
    cycle completes the redrive, then `undo`: they cannot come back, and stay where the target put them."""
    declaration = lake(make_declaration, "qc", "qa")
    send(declaration, "qa", {"a1": {}})
    cycle(declaration, "qa")  # qa's tables exist before the redrive: a restore would have a version to go to
    send(declaration, "qc", {"m1": {"fail": True}, "m2": {"fail": True}})
    cycle(declaration, "qc")
    with monkeypatch.context() as patch:
        kill_before(patch, redrive_module, "_remove_from_source", 1)
        with pytest.raises(Killed):
            redrive_table(declaration, "qc", POISON, to="qa", redrive_id="r5")
    cycle(declaration, "qa")
    assert places(declaration, "qa") == {"a1": ["processed:processed"], "m1": [POISON], "m2": [POISON]}
    assert cycle(declaration, "qc").interrupted.completed == ["r5"]
    result = undo_action(declaration, "r5")
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 0, ["m1", "m2"])
    assert places(declaration, "qc") == {}
    assert places(declaration, "qa") == {"a1": ["processed:processed"], "m1": [POISON], "m2": [POISON]}
    assert (accounted(declaration, "qc"), accounted(declaration, "qa")) == (0, 3)


def test_an_interrupted_redrive_completes_though_its_target_sent_a_copy_on(make_declaration, monkeypatch):
    """Found by the model's long profile: a redrive `--to` killed after its append; the target's cycle
    took the copies and the target's own redrive sent one back to its inbound, under a batch of its
    own. Completing the interrupted redrive still removes every original from the source: once the
    append landed, where the target takes a copy is the target's affair."""
    declaration = lake(make_declaration, "qa", "qc")
    send(declaration, "qa", {"m1": {"fail": True}, "m2": {"fail": True}})
    cycle(declaration, "qa")
    with monkeypatch.context() as patch:
        kill_before(patch, redrive_module, "_remove_from_source", 1)  # in qc/inbound, still in qa/poison
        with pytest.raises(Killed):
            redrive_table(declaration, "qa", POISON, to="qc", redrive_id="r1")
    cycle(declaration, "qc")
    assert places(declaration, "qc") == {"m1": [POISON], "m2": [POISON]}
    assert redrive_table(declaration, "qc", POISON, Selection(ids=("m1",))).moved == 1
    assert cycle(declaration, "qa").interrupted.completed == ["r1"]
    assert find_action(QueueTables.of(declaration, "qa"), "r1").state == DONE
    assert places(declaration, "qa") == {}
    assert places(declaration, "qc") == {"m1": [INBOUND], "m2": [POISON]}
    assert (accounted(declaration, "qa"), accounted(declaration, "qc")) == (0, 2)


def test_a_redrive_run_again_by_its_id_with_other_arguments_completes_as_recorded(make_declaration, monkeypatch):
    """Found by the model's long profile: a redrive into another queue killed after its append, run
    again by its id without `--to`, sent the planned messages to its own queue as well."""
    declaration = lake(make_declaration, "q", "other")
    two_in_poison(declaration)
    with monkeypatch.context() as patch:
        kill_before(patch, redrive_module, "_remove_from_source", 1)  # in other/inbound, still in q/poison
        with pytest.raises(Killed):
            redrive_table(declaration, "q", POISON, to="other", redrive_id="r1")
    again = redrive_table(declaration, "q", POISON, Selection(ids=("m1",)), redrive_id="r1")
    assert (again.target, again.moved, again.as_recorded) == ("other", 2, {"to": "other", "selection": {}})
    assert "completed as it was recorded when it was interrupted" in format_redrive(again)
    assert places(declaration) == {}
    assert places(declaration, "other") == {"m1": [INBOUND], "m2": [INBOUND]}
    assert accounted(declaration) + accounted(declaration, "other") == 2


def test_a_selection_is_the_one_its_recorded_arguments_name() -> None:
    every_filter = Selection(group="g", error_type="E", message_type="t", conversation="c",
                             failed_after=datetime(2026, 1, 1, tzinfo=UTC),
                             failed_before=datetime(2026, 2, 1, tzinfo=UTC), ids=("m1", "m2"), where="body_size > 3",
                             as_of_version=4, archived=True)
    assert {f.name for f in dataclasses.fields(Selection)} == set(every_filter.arguments())
    assert Selection.of_arguments(json.loads(json.dumps(every_filter.arguments()))) == every_filter
    assert Selection.of_arguments({}) == Selection()


def test_an_id_of_another_kind_of_action_is_refused_and_changes_nothing(make_declaration):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    redrive_table(declaration, "q", POISON, Selection(ids=("m1",)), redrive_id="r1")
    cycle(declaration)
    before = places(declaration)
    taken = "'r1' is already used by queue 'q' for an action of kind 'redrive', not '{}'"
    with pytest.raises(purge_module.PurgeError, match=taken.format("purge")):
        purge_table(declaration, "q", POISON, 0, purge_id="r1")
    with pytest.raises(edit_module.EditError, match=taken.format("edit")):
        edit_message(declaration, "m2", b'{"fail": false}', queue="q", edit_id="r1")
    with pytest.raises(edit_module.EditError, match=taken.format("edit")):
        edit_message(declaration, "m2", b'{"fail": false}', edit_id="r1")  # found in whichever queue records it
    purge_table(declaration, "q", POISON, 0, Selection(ids=("m2",)), purge_id="p1")
    with pytest.raises(RedriveError, match="'p1' is already used by queue 'q' for an action of kind 'purge', not"):
        redrive_table(declaration, "q", POISON, redrive_id="p1")
    assert places(declaration) == {"m1": before["m1"]}


def test_an_edit_run_again_by_its_id_for_another_message_completes_the_recorded_one(make_declaration, monkeypatch):
    declaration = lake(make_declaration, "q")
    two_in_poison(declaration)
    with monkeypatch.context() as patch:
        kill_before(patch, edit_module, "redrive_table", 2)  # after its dry-run probe: body recorded, nothing sent
        with pytest.raises(Killed):
            edit_message(declaration, "m1", b'{"fixed": 1}', queue="q", edit_id="e1")
    again = edit_message(declaration, "m2", b'{"fixed": 2}', queue="q", edit_id="e1")
    assert (again.message_id, again.new_body, again.moved) == ("m1", b'{"fixed": 1}', 1)
    assert places(declaration) == {"m1": [INBOUND], "m2": [POISON]}
    bodies = {r["message_id"]: r["body"] for r in QueueTables.of(declaration, "q").message_rows(INBOUND, "m1")}
    assert bodies == {"m1": b'{"fixed": 1}'}
