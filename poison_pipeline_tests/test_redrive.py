"""Redrive (SPEC section 8): failed messages go back to an inbound queue, selected by filters, with
a dry run that changes nothing, a rate, a limit, a loop guard, and an id that makes it resumable."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

from poison_pipeline import cli
from poison_pipeline.domain.declaration import LeaseSettings
from poison_pipeline.operations.actions import DONE, PLANNED, Recorded, find_action
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import RedriveRequest, redrive, redrive_table
from poison_pipeline.operations.selection import Selection, SelectionError
from poison_pipeline.storage import schemas
from poison_pipeline.storage.lease import Lease, LeaseHeld, LeaseLost
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Committer, QueueWriter
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import places, rows, seed, table_versions

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 0, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "outage_threshold": 0}


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


@pytest.fixture
def lake(spark, make_declaration, tmp_path: Path):
    """Queue q with 4 messages in poison: 3 failed on a dependency that is down (a bug that a deploy
    fixes: the file `down`), 1 with an error of its own; queue other for --to."""
    declaration = make_declaration({"q": {"handler": RECORDING, "policy": POLICY},
                                    "other": {"handler": RECORDING, "policy": POLICY}})
    down, log = tmp_path / "down", tmp_path / "calls.jsonl"
    down.touch()
    records = [{"message_id": f"db-{i}", "message_type": "withdrawal", "body": {"down_if": str(down), "log": str(log)}}
               for i in range(3)]
    records.append({"message_id": "own-1", "message_type": "refund", "body": {"fail": True, "log": str(log)}})
    assert not enqueue(declaration, "q", records).refused
    run_cycle(spark, declaration, "q", "inbound")
    assert sorted(r["message_id"] for r in rows(declaration, "poison")) == ["db-0", "db-1", "db-2", "own-1"]
    down.unlink()  # the fix is deployed
    return declaration, log


def inbound(declaration, queue: str = "q") -> dict[str, dict[str, Any]]:
    return {r["message_id"]: r for r in rows(declaration, "inbound", queue)}


def test_a_group_of_failures_goes_back_and_the_fixed_handler_processes_it(spark, lake):
    declaration, log = lake
    result = redrive_table(declaration, "q", "poison", Selection(error_type="DependencyDown"), actor="alice")
    assert (result.selected, result.moved, result.by_message_type) == (3, 3, {"withdrawal": 3})
    back = inbound(declaration)
    assert sorted(back) == ["db-0", "db-1", "db-2"]
    first = back["db-0"]
    # The whole policy applies again; the lifetime totals are kept.
    counts = ("abort_count", "move_count", "redrive_count", "total_abort_count")
    assert [first[c] for c in counts] == [0, 0, 1, 2]
    assert [r["message_id"] for r in rows(declaration, "poison")] == ["own-1"]
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["processed"] == 3
    retried = [line for line in read_lines(log) if line["redrive_count"] == 1]
    assert sorted(line["id"] for line in retried) == ["db-0", "db-1", "db-2"]
    assert all(line["total_abort_count"] == 2 and line["abort_count"] == 0 for line in retried)
    action = find_action(QueueTables.of(declaration, "q"), result.action_id)
    assert action.state == DONE and action.actor == "alice" and action.counts["moved"] == 3


def test_a_dry_run_says_what_would_move_and_changes_no_table(lake):
    declaration, _ = lake
    before = table_versions(declaration)
    result = redrive_table(declaration, "q", "poison", Selection(message_type="withdrawal"), dry_run=True)
    assert result.dry_run and result.moved == 3 and len(result.sample_ids) == 3
    assert sum(result.by_group.values()) == 3
    assert table_versions(declaration) == before
    assert not QueueTables.of(declaration, "q").exists("actions") or not rows(declaration, "actions")


def test_filters_combine_and_a_where_predicate_uses_sql(lake):
    declaration, _ = lake
    assert redrive_table(declaration, "q", "poison", Selection(message_type="withdrawal", ids=("db-1", "own-1")),
                   dry_run=True).sample_ids == ["db-1"]
    assert redrive_table(declaration, "q", "poison",
                         Selection(where="message_id LIKE 'db-%' AND total_abort_count = 2"),
                   dry_run=True).moved == 3
    future = datetime.now(UTC) + timedelta(hours=1)
    assert redrive_table(declaration, "q", "poison", Selection(failed_after=future), dry_run=True).moved == 0
    before = table_versions(declaration)
    with pytest.raises(SelectionError, match="--where 'no_such_column = 1' is not a predicate"):
        redrive_table(declaration, "q", "poison", Selection(where="no_such_column = 1"))
    with pytest.raises(ValidationError, match="rate\n  Value error, 0.0: give a positive number"):
        redrive(declaration, RedriveRequest(queue="q", source_tables=["poison"], rate=0))
    assert table_versions(declaration) == before


def test_a_rate_spreads_due_times_and_releases_chunk_by_chunk(lake):
    declaration, _ = lake
    now = datetime(2030, 1, 1, tzinfo=UTC)
    result = redrive_table(declaration, "q", "poison", Selection(message_type="withdrawal"), rate=0.1, now=now)
    due = sorted(r["due_at"] for r in inbound(declaration).values())
    assert due == [now, now + timedelta(seconds=10), now + timedelta(seconds=20)]
    assert (result.first_due, result.last_due) == (now, now + timedelta(seconds=20))
    stats = QueueTables.of(declaration, "q").stats("inbound", now + timedelta(seconds=5))
    assert stats.due_rows == 1  # the sensor releases them as they come due, not all at once


def test_a_limit_and_the_loop_guard_leave_messages_where_they_are(spark, lake, tmp_path):
    declaration, _ = lake
    first = redrive_table(declaration, "q", "poison", Selection(message_type="withdrawal"), limit=2)
    assert (first.moved, first.skipped_limit) == (2, 1)
    # own-1 fails every time: redriven max_redrives (3) times, the fourth is refused unless forced.
    for n in range(3):
        assert redrive_table(declaration, "q", "poison", Selection(ids=("own-1",)), redrive_id=f"own-{n}").moved == 1
        run_cycle(spark, declaration, "q", "inbound")
    guarded = redrive_table(declaration, "q", "poison", Selection(ids=("own-1",)), redrive_id="own-3")
    assert (guarded.moved, guarded.skipped_loop_guard) == (0, 1)
    forced = redrive_table(declaration, "q", "poison", Selection(ids=("own-1",)), redrive_id="own-4", force=True)
    assert forced.moved == 1 and inbound(declaration)["own-1"]["redrive_count"] == 4


def test_messages_the_target_already_processed_are_skipped(spark, lake):
    declaration, _ = lake
    redrive_table(declaration, "q", "poison", Selection(ids=("db-0",)), redrive_id="first")
    run_cycle(spark, declaration, "q", "inbound")
    # A copy of db-0 is still in poison (say, an operator restored it): the target processed it already.
    tables = QueueTables.of(declaration, "q")
    copy = [{**r, "message_id": "db-0", "batch_id": "restored"} for r in rows(declaration, "poison")[:1]]
    seed(tables, "poison", pa.Table.from_pylist(copy, schema=schemas.MESSAGE))
    result = redrive_table(declaration, "q", "poison", Selection(ids=("db-0",)), redrive_id="second")
    assert (result.moved, result.skipped_processed) == (0, 1)


def test_redrive_to_another_queue(lake):
    declaration, _ = lake
    result = redrive_table(declaration, "q", "poison", Selection(ids=("db-2",)), to="other")
    assert result.target == "other" and sorted(inbound(declaration, "other")) == ["db-2"]
    assert "db-2" not in {r["message_id"] for r in rows(declaration, "poison")}


def test_the_same_redrive_twice_moves_nothing_the_second_time(lake):
    declaration, _ = lake
    selection = Selection(message_type="withdrawal")
    assert redrive_table(declaration, "q", "poison", selection, redrive_id="r1").moved == 3
    before = table_versions(declaration)
    again = redrive_table(declaration, "q", "poison", selection, redrive_id="r1")
    assert again.already_done and again.moved == 0
    # Without an id it is a new redrive, which finds nothing left to move.
    fresh = redrive_table(declaration, "q", "poison", selection)
    assert (fresh.redrive_id != "r1", fresh.already_done, fresh.moved) == (True, False, 0)
    assert table_versions(declaration) == before


STEPS = ["plan", "append", "remove", "finish"]


@pytest.mark.parametrize("step", STEPS)
def test_killed_at_each_step_and_run_again_it_completes_without_moving_anything_twice(lake, monkeypatch, step):
    declaration, _ = lake
    targets = {"plan": (Recorded, "record_plan"), "append": (Committer, "append"),
               "remove": (QueueWriter, "replace_batches"), "finish": (Recorded, "finish")}
    owner, name = targets[step]
    original = getattr(owner, name)

    def die(*args: Any, **kwargs: Any) -> Any:
        if name != "append" or args[1] == "inbound":  # the actions ledger's own appends go through
            raise Crash(step)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, die)
    selection = Selection(message_type="withdrawal")
    with pytest.raises(Crash):
        redrive_table(declaration, "q", "poison", selection, rate=0.05, redrive_id="r1")  # three chunks: three appends
    monkeypatch.setattr(owner, name, original)
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, "r1").state == PLANNED
    result = redrive_table(declaration, "q", "poison", selection, rate=0.05, redrive_id="r1")
    assert not result.already_done
    where = places(declaration)
    assert {mid: where[mid] for mid in ("db-0", "db-1", "db-2")} == {f"db-{i}": ["inbound"] for i in range(3)}
    assert where["own-1"] == ["poison"]
    assert redrive_table(declaration, "q", "poison", selection, rate=0.05, redrive_id="r1").already_done


def test_the_cli_redrives_with_json_and_refuses_bad_input(lake, tmp_path, capsys):
    declaration, _ = lake
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    run = ["--config", str(config), "redrive", "q", "--from", "poison"]
    assert cli.main([*run, "--error-type", "DependencyDown", "--dry-run", "--json"]) == cli.EXIT_OK
    planned = json.loads(capsys.readouterr().out)
    assert planned["dry_run"] and planned["moved"] == 3 and planned["by_message_type"] == {"withdrawal": 3}
    assert planned["redrive_id"] is planned["action_id"] is None  # nothing recorded: no id for `undo`
    assert cli.main([*run, "--where", "nonsense ("]) == cli.EXIT_USAGE
    assert "is not a predicate over the columns of poison" in capsys.readouterr().err
    assert cli.main([*run, "--message-type", "nothing-like-this"]) == cli.EXIT_INCOMPLETE
    assert "nothing to move: 0 message(s) selected" in capsys.readouterr().err
    assert cli.main([*run, "--error-type", "DependencyDown", "--rate", "50/s"]) == cli.EXIT_OK
    assert "moved 3 of 3 selected" in capsys.readouterr().out


def test_the_cli_redrives_several_tables_each_as_its_own_action_sharing_the_rate(lake, tmp_path, capsys):
    declaration, _ = lake
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    run = ["--config", str(config), "redrive", "q", "--from", "poison", "--from", "dead_letter", "--id", "r1"]
    assert cli.main([*run, "--rate", "2/s", "--json"]) == cli.EXIT_OK
    poison, dead_letter = json.loads(capsys.readouterr().out)
    assert (poison["redrive_id"], poison["moved"]) == ("r1--poison", 4)
    assert (dead_letter["redrive_id"], dead_letter["selected"], dead_letter["action_id"]) == \
        ("r1--dead_letter", 0, None)
    # The rate is shared by the tables with something to move: poison alone has the whole 2/s.
    due = sorted(r["due_at"] for r in rows(declaration, "inbound"))
    assert (due[-1] - due[0]).total_seconds() == pytest.approx(1.5)
    assert find_action(QueueTables.of(declaration, "q"), "r1--poison").state == DONE
    assert cli.main(["--config", str(config), "undo", "r1--poison", "--queue", "other"]) == cli.EXIT_USAGE
    assert "no such action in queue 'other'; it is an action of queue 'q'" in capsys.readouterr().err
    assert cli.main(["--config", str(config), "undo", "r1--poison", "--queue", "q"]) == cli.EXIT_OK
    assert sorted(r["message_id"] for r in rows(declaration, "poison")) == ["db-0", "db-1", "db-2", "own-1"]


def test_a_failure_group_from_groups_selects_what_redrive_moves(lake):
    declaration, _ = lake
    groups = {g.error_type.rsplit(".", 1)[-1]: g for g in failure_groups(declaration, "q", "poison")}
    down = groups["DependencyDown"]
    assert down.count == 3
    result = redrive_table(declaration, "q", "poison", Selection(group=down.id))
    assert result.moved == 3 and sorted(inbound(declaration)) == ["db-0", "db-1", "db-2"]
    assert result.by_group == {down.id: 3}
    # The group's messages all left: a second redrive of it has nothing to move, and changes nothing.
    before = table_versions(declaration)
    assert redrive_table(declaration, "q", "poison", Selection(group=down.id)).moved == 0
    assert table_versions(declaration) == before
    with pytest.raises(SelectionError, match="--group failure group 'nope': not a group id"):
        redrive_table(declaration, "q", "poison", Selection(group="nope"))


def test_redrive_of_a_group_whose_messages_all_left_exits_1_nothing_to_move(lake, tmp_path, capsys):
    declaration, _ = lake
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(json.loads(declaration.model_dump_json())))
    [down] = [g for g in failure_groups(declaration, "q", "poison") if g.error_type.endswith("DependencyDown")]
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", "--group", down.id]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", "--group", down.id]) == \
        cli.EXIT_INCOMPLETE
    assert "nothing to move" in capsys.readouterr().err
    # From every failure table: the same answer, and nothing changes.
    every = ["--from", "poison", "--from", "dead_letter", "--from", "quarantine"]
    before = table_versions(declaration)
    assert cli.main(["--config", str(config), "redrive", "q", *every, "--group", down.id]) == cli.EXIT_INCOMPLETE
    assert "nothing to move" in capsys.readouterr().err
    assert table_versions(declaration) == before
    # A group id that is no id at all stays a bad argument.
    assert cli.main(["--config", str(config), "redrive", "q", *every, "--group", "nope"]) == cli.EXIT_USAGE


def test_a_redrive_against_a_running_cycle_waits_then_fails_naming_it_and_changes_nothing(spark, lake, tmp_path):
    declaration, log = lake
    impatient = declaration.model_copy(update={"lease": LeaseSettings(wait="500ms", expiry="3s")})
    gate = tmp_path / "gate"
    gate.touch()
    assert not enqueue(declaration, "q", [{"message_id": "slow-1", "message_type": "t",
                                           "body": {"hold_while": str(gate), "log": str(log)}}]).refused
    cycle = threading.Thread(target=lambda: run_cycle(spark, declaration, "q", "inbound", run_id="busy-cycle"))
    cycle.start()
    try:
        deadline = time.monotonic() + 120
        while not any(line["id"] == "slow-1" for line in read_lines(log)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        before = table_versions(declaration)
        with pytest.raises(LeaseHeld, match="run busy-cycle \\(inbound cycle\\)"):
            redrive_table(impatient, "q", "poison", Selection(message_type="withdrawal"))
        assert table_versions(declaration) == before
    finally:
        gate.unlink()
        cycle.join()
    # Once the cycle is done, the same redrive goes through.
    assert redrive_table(impatient, "q", "poison", Selection(message_type="withdrawal")).moved == 3


def test_a_redrive_reports_its_progress_chunk_by_chunk(lake):
    declaration, _ = lake
    heard: list[tuple[int, int]] = []
    redrive_table(declaration, "q", "poison", Selection(message_type="withdrawal"), rate=0.05,
            progress=lambda moved, total: heard.append((moved, total)))
    assert heard == [(1, 3), (2, 3), (3, 3)]  # three chunks of due times: one append each


def test_a_redrive_that_lost_its_lease_exits_3_with_one_line_and_commits_nothing(lake, tmp_path, capsys,
                                                                                 monkeypatch):
    declaration, _ = lake
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    before = table_versions(declaration)

    def taken_over(self: Lease) -> None:  # as a renewal finds it once another run took the lease
        raise LeaseLost(f"the lease of queue {self.queue!r} was taken over by run other: this run "
                        f"({self.run_id}) stops before committing anything more")

    monkeypatch.setattr(Lease, "check", taken_over)
    code = cli.main(["--config", str(config), "redrive", "q", "--from", "poison"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BUSY
    assert err.startswith("poison-pipeline redrive: error: the lease of queue 'q' was taken over by run other")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert table_versions(declaration) == before


def test_a_dry_run_on_the_command_line_names_no_action_that_undo_would_not_know(lake, tmp_path, capsys):
    declaration, _ = lake
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", "--dry-run"]) == cli.EXIT_OK
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("redrive (dry run): q/poison -> q/inbound: would move 4 of 4 selected")
    assert line.endswith("(dry run: no table changed, no action recorded)")
    assert cli.main(["--config", str(config), "actions", "--json"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == []
