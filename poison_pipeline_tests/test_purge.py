"""Purge and retention (SPEC section 8): failed messages deleted for good, older than an age and
selected by redrive's filters, with a dry run that changes nothing, a confirmation, a purged ledger
that keeps the conservation line balanced, and crash safety at every commit."""

from __future__ import annotations

import io
import json
import shutil
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from poison_pipeline import cli
from poison_pipeline.domain.declaration import Declaration, DeclarationError, parse_declaration
from poison_pipeline.operations.actions import DONE, PLANNED, Recorded, find_action, list_actions
from poison_pipeline.operations.archive import apply_retention
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.purge import RETENTION_ACTOR, PurgeError, PurgeRequest, purge_table
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.selection import Selection, SelectionError
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage.tables import PLANS, QueueTables
from poison_pipeline.storage.writer import Committer, QueueWriter
from poison_pipeline.text.purge import format_purge
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.operation_process import run_forked
from poison_pipeline_tests.support import kill_sample, rows, table_versions
from poison_pipeline_tests.test_operation_crash import COMMITS

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
MOVE = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
        "receive_error_handling": "move", "outage_threshold": 0}
REJECT = {**MOVE, "receive_error_handling": "reject"}
RECEIVED = {"q": 6, "r": 2}


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


def _queues() -> dict[str, Any]:
    return {"q": {"handler": RECORDING, "policy": MOVE}, "r": {"handler": RECORDING, "policy": REJECT}}


def _declaration(root: Path, **queue_extra: Any) -> Declaration:
    queues = _queues()
    queues["q"].update(queue_extra)
    # A short lease expiry: the next purge after a kill -9 takes the dead holder's lease soon.
    return parse_declaration({"lake_root": str(root), "spark": SPARK.model_dump(), "queues": queues,
                              "lease": {"expiry": "2s"}})


def _send(declaration: Declaration, queue: str, ids: list[str], message_type: str) -> None:
    records = [{"message_id": i, "message_type": message_type, "body": {"fail": True}} for i in ids]
    assert not enqueue(declaration, queue, records).refused


@pytest.fixture(scope="module")
def template(spark, tmp_path_factory) -> tuple[Path, datetime]:
    """Built once, copied for each test: queue q with old-0..2 in quarantine (failed first), then
    new-0..2 in poison (failed after `between`); queue r with dl-0..1 in dead_letter (reject)."""
    root = tmp_path_factory.mktemp("purge") / "lake"
    declaration = _declaration(root)
    _send(declaration, "q", ["old-0", "old-1", "old-2"], "withdrawal")
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "poison")  # the default poison reader quarantines them
    between = datetime.now(UTC)
    _send(declaration, "q", ["new-0", "new-1"], "withdrawal")
    _send(declaration, "q", ["new-2"], "refund")
    run_cycle(spark, declaration, "q", "inbound")
    _send(declaration, "r", ["dl-0", "dl-1"], "order")
    run_cycle(spark, declaration, "r", "inbound")
    return root, between


@pytest.fixture
def lake(template, tmp_path) -> tuple[Declaration, datetime]:
    root, between = template
    shutil.copytree(root, tmp_path / "lake")
    declaration = _declaration(tmp_path / "lake")
    assert ids(declaration, "quarantine") == ["old-0", "old-1", "old-2"]
    assert ids(declaration, "poison") == ["new-0", "new-1", "new-2"]
    assert ids(declaration, "dead_letter", "r") == ["dl-0", "dl-1"]
    return declaration, between


def ids(declaration: Declaration, table: str, queue: str = "q") -> list[str]:
    return sorted(r["message_id"] for r in rows(declaration, table, queue))


def balanced(declaration: Declaration) -> None:
    for queue, received in RECEIVED.items():
        line = conservation(QueueTables.of(declaration, queue))
        assert line.accounted == received, line.line(received)


LATER = timedelta(days=31)  # "now" a month on: every failure is older than 30d


def test_each_table_is_purged_its_ids_kept_in_the_ledger_and_conservation_balances(lake):
    declaration, _ = lake
    now = datetime.now(UTC) + LATER
    for queue, table, expected in (("q", "poison", 3), ("q", "quarantine", 3), ("r", "dead_letter", 2)):
        result = purge_table(declaration, queue, table, "30d", actor="alice", now=now)
        assert (result.purged, result.dry_run) == (expected, False)
        assert ids(declaration, table, queue) == []
        action = find_action(QueueTables.of(declaration, queue), result.action_id)
        assert action.state == DONE and action.actor == "alice" and action.counts["purged"] == expected
        assert action.versions[f"{queue}/{table}"]["after"] > action.versions[f"{queue}/{table}"]["before"]
    ledger = rows(declaration, "purged")
    assert sorted((r["message_id"], r["from_table"]) for r in ledger) == [
        ("new-0", "poison"), ("new-1", "poison"), ("new-2", "poison"),
        ("old-0", "quarantine"), ("old-1", "quarantine"), ("old-2", "quarantine")]
    balanced(declaration)
    line = conservation(QueueTables.of(declaration, "q"))
    assert line.purged == 6 and line.line(6).endswith("+ 6 purged (= 6)  OK")


def test_older_than_is_a_failure_time_bound_and_filters_combine(lake):
    declaration, between = lake
    # An hour after `between`, with --older-than 1h: only what failed before `between` (quarantine).
    assert purge_table(declaration, "q", "quarantine", "1h", dry_run=True, now=between + timedelta(hours=1)).purged == 3
    assert purge_table(declaration, "q", "poison", "1h", dry_run=True, now=between + timedelta(hours=1)).purged == 0
    assert purge_table(declaration, "q", "poison", "30d", dry_run=True).purged == 0  # nothing is that old yet
    now = datetime.now(UTC) + LATER
    assert purge_table(declaration, "q", "poison", "30d", Selection(message_type="refund"), dry_run=True,
                 now=now).sample_ids == ["new-2"]
    assert purge_table(declaration, "q", "poison", "30d", Selection(where="message_id LIKE 'new-%' AND "
                                                                   "message_type = 'withdrawal'"),
                 dry_run=True, now=now).purged == 2
    [group] = purge_table(declaration, "q", "quarantine", "30d", dry_run=True, now=now).by_group
    assert len(group) == 8  # the id `groups` shows and --group takes
    assert purge_table(declaration, "q", "quarantine", "30d", Selection(group=group), dry_run=True, now=now).purged == 3
    result = purge_table(declaration, "q", "poison", "30d", Selection(ids=("new-0", "old-0")), now=now)
    assert result.purged == 1 and ids(declaration, "poison") == ["new-1", "new-2"]
    balanced(declaration)


def test_a_dry_run_says_what_would_be_deleted_and_changes_no_table(lake):
    declaration, _ = lake
    before = table_versions(declaration)
    result = purge_table(declaration, "q", "poison", "30d", dry_run=True, now=datetime.now(UTC) + LATER)
    assert result.dry_run and result.purged == 3 and sum(result.by_group.values()) == 3
    assert result.by_message_type == {"withdrawal": 2, "refund": 1} and len(result.sample_ids) == 3
    assert "would delete 3 message(s) for good (dry run: no table changed, no action recorded)" in format_purge(result)
    assert table_versions(declaration) == before
    assert rows(declaration, "purged") == []


def test_bad_input_is_refused_before_any_table_changes(lake):
    declaration, _ = lake
    before = table_versions(declaration)
    with pytest.raises(ValidationError, match="older_than\n  Value error, 'soon' is not a duration"):
        PurgeRequest(queue="q", table="poison", older_than="soon")
    with pytest.raises(ValidationError, match="table\n  Value error, 'inbound': choose poison, dead_letter"):
        PurgeRequest(queue="q", table="inbound", older_than="1d")
    with pytest.raises(PurgeError, match="no queue 'nope' is declared"):
        purge_table(declaration, "nope", "poison", "1d")
    with pytest.raises(SelectionError, match="--where 'no_such_column = 1' is not a predicate"):
        purge_table(declaration, "q", "poison", "0s", Selection(where="no_such_column = 1"))
    with pytest.raises(SelectionError, match="the range is empty"):
        purge_table(declaration, "q", "poison", "0s", Selection(failed_after=datetime.now(UTC)),
              now=datetime.now(UTC) - timedelta(days=1))
    nothing = purge_table(declaration, "q", "poison", "0s", Selection(message_type="no-such-type"))
    assert nothing.purged == 0 and nothing.action_id is None
    assert table_versions(declaration) == before


def test_retention_is_declared_validated_and_applied_by_age(lake, tmp_path):
    declaration, between = lake
    with pytest.raises(DeclarationError, match=r"queues.q.retention .*retention applies to poison, dead_letter, "
                                               r"quarantine or archived, not 'inbound'"):
        _declaration(tmp_path / "lake", retention={"inbound": "1d"})
    with pytest.raises(DeclarationError, match="not a duration"):
        _declaration(tmp_path / "lake", retention={"poison": "a while"})
    with pytest.raises(DeclarationError, match="must be a positive duration"):
        _declaration(tmp_path / "lake", retention={"poison": 0})
    kept = _declaration(tmp_path / "lake", retention={"quarantine": "1h", "poison": "2h"})
    # An hour after `between`: quarantine (failed before it) is past 1h; poison (after it) is not past 2h.
    results = apply_retention(kept, "q", now=between + timedelta(hours=1, seconds=1))
    assert [(r.table, r.purged, r.actor) for r in results] == [("quarantine", 3, RETENTION_ACTOR),
                                                              ("poison", 0, RETENTION_ACTOR)]
    assert ids(kept, "quarantine") == [] and ids(kept, "poison") == ["new-0", "new-1", "new-2"]
    recorded = [a for a in list_actions(kept, "q") if a.kind == "purge"]
    assert [(a.actor, a.state, a.arguments["table"]) for a in recorded] == [(RETENTION_ACTOR, DONE, "quarantine")]
    balanced(kept)


STEPS = ["begin", "plan", "ledger", "remove", "finish"]


@pytest.mark.parametrize("with_id", [True, False])
@pytest.mark.parametrize("step", STEPS)
def test_killed_at_each_step_and_run_again_nothing_is_lost_or_deleted_twice(lake, monkeypatch, step, with_id):
    declaration, _ = lake
    targets = {"begin": (Recorded, "begin"), "plan": (Recorded, "record_plan"),
               "ledger": (Committer, "append"), "remove": (QueueWriter, "replace_batches"),
               "finish": (Recorded, "finish")}
    owner, name = targets[step]
    original = getattr(owner, name)

    def die(*args: Any, **kwargs: Any) -> Any:
        if name != "append" or args[1] == "purged":  # the actions ledger's own appends go through
            raise Crash(step)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, die)
    now = datetime.now(UTC) + LATER
    with pytest.raises(Crash):
        purge_table(declaration, "q", "poison", "30d", Selection(message_type="withdrawal"), purge_id="p1", now=now)
    monkeypatch.setattr(owner, name, original)
    tables = QueueTables.of(declaration, "q")
    if step != "begin":
        assert find_action(tables, "p1").state == PLANNED
    if with_id:  # the same purge again, by its id
        again = purge_table(declaration, "q", "poison", "30d", Selection(message_type="withdrawal"), purge_id="p1",
                      now=now)
        assert again.purged == 2
    else:  # any later purge of the queue completes the interrupted one first
        other = purge_table(declaration, "q", "quarantine", "30d", now=now)
        assert other.purged == 3 and other.resumed == ([] if step == "begin" else ["p1"])
        if step == "begin":  # it had recorded nothing: the purge simply runs again
            assert purge_table(declaration, "q", "poison", "30d", Selection(message_type="withdrawal"), purge_id="p1",
                         now=now).purged == 2
    assert ids(declaration, "poison") == ["new-2"]
    ledger = sorted(r["message_id"] for r in rows(declaration, "purged") if r["from_table"] == "poison")
    assert ledger == ["new-0", "new-1"]  # once each
    assert find_action(tables, "p1").state == DONE
    balanced(declaration)
    before = table_versions(declaration)
    assert purge_table(declaration, "q", "poison", "30d", purge_id="p1", now=now).already_done
    assert table_versions(declaration) == before


@pytest.mark.parametrize("table", ["poison", "quarantine"])
def test_an_undo_killed_between_its_restores_leaves_every_message_somewhere(lake, monkeypatch, table):
    declaration, _ = lake
    done = purge_table(declaration, "q", table, "30d", now=datetime.now(UTC) + LATER)
    gone = ids(declaration, "purged")
    assert done.purged == 3 and ids(declaration, table) == []
    real, calls = QueueWriter.restore, []

    def die_on_second(self: QueueWriter, *args: Any, **kwargs: Any) -> None:
        calls.append(args[0])
        if len(calls) == 2:
            raise Crash("between the restores")
        real(self, *args, **kwargs)

    monkeypatch.setattr(QueueWriter, "restore", die_on_second)
    with pytest.raises(Crash):
        undo_action(declaration, done.action_id)
    monkeypatch.setattr(QueueWriter, "restore", real)
    # Back in the table, not yet out of the ledger: in two places for a moment, never in none.
    assert calls == [table, "purged"]
    assert ids(declaration, table) == gone and ids(declaration, "purged") == gone
    assert undo_action(declaration, done.action_id).restored == 3
    assert ids(declaration, table) == gone and ids(declaration, "purged") == []
    balanced(declaration)


def _config(declaration: Declaration, tmp_path: Path) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    return str(config)


def test_the_cli_confirms_refuses_without_a_terminal_and_prints_stable_json(lake, tmp_path, capsys, monkeypatch):
    declaration, _ = lake
    run = ["--config", _config(declaration, tmp_path), "purge", "q", "--table", "poison", "--older-than", "0s"]
    before = table_versions(declaration)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    assert cli.main(run) == cli.EXIT_INCOMPLETE
    out, err = capsys.readouterr()
    assert "would delete 3 message(s) for good" in out and "new-0" in out
    assert "refusing to delete 3 message(s) without --yes" in err
    assert table_versions(declaration) == before

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    assert cli.main([*run, "--message-type", "refund"]) == cli.EXIT_INCOMPLETE
    assert "Delete 1 messages for good? [y/N]" in capsys.readouterr().err
    assert table_versions(declaration) == before
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    assert cli.main([*run, "--message-type", "refund"]) == cli.EXIT_OK
    assert "deleted 1 message(s) for good" in capsys.readouterr().out
    assert ids(declaration, "poison") == ["new-0", "new-1"]

    assert cli.main([*run, "--yes", "--json", "--actor", "bob"]) == cli.EXIT_OK
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"purge_id", "queue", "table", "dry_run", "older_than_seconds", "cutoff", "selected",
                           "purged", "skipped_moved_since", "skipped_held", "held_by", "already_done", "resumed",
                           "by_group", "by_message_type", "sample_ids",
                           "oldest_failure", "newest_failure", "actor", "action_id"}
    assert (result["purged"], result["by_message_type"], result["actor"]) == (2, {"withdrawal": 2}, "bob")
    balanced(declaration)

    assert cli.main([*run, "--yes"]) == cli.EXIT_INCOMPLETE
    assert "nothing to purge" in capsys.readouterr().err
    for bad, expected in ((["--older-than", "soon"], "is not a duration"),
                          (["--where", "nonsense ("], "is not a predicate over the columns of poison")):
        args = [*run[:-2], *bad] if bad[0] == "--older-than" else [*run, *bad]
        assert cli.main([*args, "--yes"]) == cli.EXIT_USAGE
        assert expected in capsys.readouterr().err


def test_an_age_in_plain_seconds_is_taken_on_the_command_line(lake, tmp_path, capsys):
    declaration, _ = lake
    run = ["--config", _config(declaration, tmp_path), "purge", "q", "--table", "poison", "--json", "--older-than"]
    before = table_versions(declaration)
    # Everything in poison failed seconds ago: older than 90 seconds, nothing.
    assert cli.main([*run, "90", "--yes"]) == cli.EXIT_INCOMPLETE
    out, err = capsys.readouterr()
    assert json.loads(out)["older_than_seconds"] == 90 and "nothing to purge" in err
    assert table_versions(declaration) == before
    assert cli.main([*run, "0", "--yes"]) == cli.EXIT_OK
    result = json.loads(capsys.readouterr().out)
    assert (result["older_than_seconds"], result["purged"]) == (0, 3)
    assert ids(declaration, "poison") == []


PURGE_COMMITS = COMMITS["purge"]  # the census in test_operation_crash keeps it true to the code


@pytest.mark.parametrize("command, step", kill_sample([("purge", s) for s in range(1, len(PURGE_COMMITS) + 1)],
                                                     per_group=2))
def test_a_real_kill_9_after_each_commit_point_and_the_next_purge_completes_it(lake, tmp_path, command, step):
    declaration, _ = lake
    now = datetime.now(UTC) + LATER
    args = {"queue": "q", "table": "poison", "older_than": "30d", "selection": {"message_type": "withdrawal"},
            "id": "p1", "now": now.isoformat()}
    killed = run_forked(_config(declaration, tmp_path), "purge", step, args)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert json.loads(killed.stdout.splitlines()[-1])["commit"] == PURGE_COMMITS[step - 1]
    # The next purge of the queue, whatever it asks, completes p1 first (once the lease the killed
    # process held has expired).
    other = purge_table(declaration, "q", "quarantine", "30d", now=now)
    # Killed once it was recorded done (its plan's removal may follow), it has nothing left to complete.
    done_at = PURGE_COMMITS.index("q/actions WRITE Overwrite p1:done") + 1
    assert other.purged == 3 and other.resumed == ([] if step >= done_at else ["p1"])
    assert rows(declaration, PLANS) == [], "a plan left behind"
    assert not (Path(declaration.lake_root) / "q" / "_work" / "purge").exists() or not any(
        (Path(declaration.lake_root) / "q" / "_work" / "purge").iterdir())  # nor a plan file of before
    assert ids(declaration, "poison") == ["new-2"]
    ledger = sorted(r["message_id"] for r in rows(declaration, "purged") if r["from_table"] == "poison")
    assert ledger == ["new-0", "new-1"]
    assert find_action(QueueTables.of(declaration, "q"), "p1").state == DONE
    balanced(declaration)
