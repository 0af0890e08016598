"""Undo of a redrive, a purge or an edit: by restoring the recorded versions when nothing touched the
tables since, by moving back what is still where the action put it otherwise, naming what cannot
come back; run again, nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from poison_pipeline.defs.alerts import decide_alerts
from poison_pipeline.domain.alerts import ACTION_LEFT
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations import undo as undo_module
from poison_pipeline.operations.actions import DONE, PLANNED, UNDONE, begin_action, find_action
from poison_pipeline.operations.archive import ArchiveRequest, RestoreRequest, archive, restore
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import edit_message, edits_of
from poison_pipeline.operations.purge import purge_table
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import UndoError, undo_action
from poison_pipeline.storage.tables import PURGED, QueueTables
from poison_pipeline.storage.writer import QueueWriter, queue_writer
from poison_pipeline.text.undo import format_undo
from poison_pipeline_tests.support import places, rows, table_versions
from poison_pipeline_tests.test_redrive import lake  # noqa: F401 - the shared fixture

WITHDRAWALS = Selection(message_type="withdrawal")


def poison_ids(declaration) -> list[str]:
    return sorted(r["message_id"] for r in rows(declaration, "poison"))


def test_undo_right_after_a_redrive_brings_back_the_rows_as_they_were(lake):  # noqa: F811
    declaration, _ = lake
    before = rows(declaration, "poison")
    done = redrive_table(declaration, "q", "poison", WITHDRAWALS)
    result = undo_action(declaration, done.action_id, actor="carol")
    # An inbound is never restored (it accepts enqueues without the lease): the undo compensates.
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 3, [])
    assert sorted(map(str, rows(declaration, "poison"))) == sorted(map(str, before))
    assert rows(declaration, "inbound") == []
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, done.action_id).state == UNDONE
    assert find_action(tables, result.undo_id).actor == "carol"
    assert undo_action(declaration, done.action_id).already_undone


def test_undo_after_later_commits_moves_back_what_is_still_there_and_names_the_rest(spark, lake):  # noqa: F811
    declaration, _ = lake
    now = datetime.now(UTC)
    done = redrive_table(declaration, "q", "poison", WITHDRAWALS, rate=0.05, now=now)  # db-0 due now, the others later
    assert not enqueue(declaration, "q", [{"message_id": "new-1", "message_type": "t", "body": {}}], now=now).refused
    run_cycle(spark, declaration, "q", "inbound", now=now + timedelta(seconds=1))  # processes db-0 and new-1
    result = undo_action(declaration, done.action_id)
    assert result.how == "compensate"
    assert (result.restored, result.unrecoverable) == (2, ["db-0"])
    assert poison_ids(declaration) == ["db-1", "db-2", "own-1"]
    where = places(declaration)
    assert where["db-0"] == ["processed:processed"] and where["new-1"] == ["processed:processed"]
    assert rows(declaration, "inbound") == []
    # Run again: nothing moves twice.
    assert undo_action(declaration, done.action_id).already_undone
    assert poison_ids(declaration) == ["db-1", "db-2", "own-1"]


def test_undo_refuses_what_it_cannot_undo(lake):  # noqa: F811
    declaration, _ = lake
    with pytest.raises(UndoError, match="no action 'nope' is recorded"):
        undo_action(declaration, "nope")
    done = redrive_table(declaration, "q", "poison", WITHDRAWALS)
    reverse = undo_action(declaration, done.action_id)
    with pytest.raises(UndoError, match="is of kind 'undo', which cannot be undone"):
        undo_action(declaration, reverse.undo_id)


# Purge


LATER = timedelta(days=1)  # every failure is older than an hour


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


def purged(declaration) -> list[tuple[str, str]]:
    return sorted((r["message_id"], r["action_id"]) for r in rows(declaration, PURGED))


def balanced(declaration, received: int = 4) -> None:
    line = conservation(QueueTables.of(declaration, "q"))
    assert line.accounted == received, line.line(received)


def test_undo_right_after_a_purge_restores_the_versions_before_it(lake):  # noqa: F811
    declaration, _ = lake
    done = purge_table(declaration, "q", "poison", "1h", WITHDRAWALS, now=datetime.now(UTC) + LATER)
    assert poison_ids(declaration) == ["own-1"] and len(purged(declaration)) == 3
    result = undo_action(declaration, done.action_id, actor="carol")
    assert (result.kind, result.how, result.restored, result.unrecoverable) == ("purge", "restore", 3, [])
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2", "own-1"]
    assert purged(declaration) == []
    balanced(declaration)
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, done.action_id).state == UNDONE
    assert find_action(tables, result.undo_id).state == DONE
    before = table_versions(declaration)
    assert undo_action(declaration, done.action_id).already_undone
    assert table_versions(declaration) == before


def test_undo_of_a_purge_after_another_purge_appends_back_and_balances(lake, monkeypatch):  # noqa: F811
    declaration, _ = lake
    later = datetime.now(UTC) + LATER
    first = purge_table(declaration, "q", "poison", "1h", WITHDRAWALS, now=later)
    second = purge_table(declaration, "q", "poison", "1h", Selection(message_type="refund"), now=later)
    assert poison_ids(declaration) == [] and len(purged(declaration)) == 4
    balanced(declaration)
    # Killed after it changed the tables, before it marked the purge undone: run again, nothing twice.
    real = undo_module.mark_undone

    def die(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(undo_module, "mark_undone", die)
    with pytest.raises(Crash):
        undo_action(declaration, first.action_id)
    monkeypatch.setattr(undo_module, "mark_undone", real)
    result = undo_action(declaration, first.action_id)
    assert (result.how, result.unrecoverable) == ("compensate", [])
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2"]
    assert [r["body"] for r in rows(declaration, "poison")] != [None] * 3
    assert purged(declaration) == [("own-1", second.action_id)]
    balanced(declaration)
    assert find_action(QueueTables.of(declaration, "q"), first.action_id).state == UNDONE
    before = table_versions(declaration)
    assert undo_action(declaration, first.action_id).already_undone
    assert table_versions(declaration) == before


def test_undo_of_a_purge_whose_files_were_vacuumed_names_them_and_changes_nothing(lake):  # noqa: F811
    declaration, _ = lake
    later = datetime.now(UTC) + LATER
    first = purge_table(declaration, "q", "poison", "1h", WITHDRAWALS, now=later)
    purge_table(declaration, "q", "poison", "1h", Selection(message_type="refund"), now=later)
    tables = QueueTables.of(declaration, "q")
    DeltaTable(tables.uri("poison")).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    before = table_versions(declaration)
    with pytest.raises(UndoError, match=r"vacuum.*db-0, db-1, db-2"):
        undo_action(declaration, first.action_id)
    assert table_versions(declaration) == before
    assert find_action(tables, first.action_id).state == DONE
    balanced(declaration)


# Edit


def body_of(declaration, table: str, message_id: str) -> bytes:
    (row,) = [r for r in rows(declaration, table) if r["message_id"] == message_id]
    return row["body"]


def edited(declaration, log) -> str:
    result = edit_message(declaration, "db-0", json.dumps({"log": str(log)}).encode(), {"fixed-by": "alice"})
    assert result.moved == 1
    return result.edit_id


def test_undo_right_after_an_edit_brings_the_original_body_back_and_keeps_the_edit(lake):  # noqa: F811
    declaration, log = lake
    original = body_of(declaration, "poison", "db-0")
    edit_id = edited(declaration, log)
    result = undo_action(declaration, edit_id)
    assert (result.kind, result.how, result.restored, result.unrecoverable) == ("edit", "compensate", 1, [])
    assert body_of(declaration, "poison", "db-0") == original
    assert rows(declaration, "inbound") == []
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, edit_id).state == UNDONE
    assert find_action(tables, f"{edit_id}--redrive").state == UNDONE
    assert [e["edit_id"] for e in edits_of(declaration, "db-0")] == [edit_id]  # history stays
    before = table_versions(declaration)
    assert undo_action(declaration, edit_id).already_undone
    assert table_versions(declaration) == before


def test_undo_of_an_edit_after_an_enqueue_moves_the_message_back(lake):  # noqa: F811
    declaration, log = lake
    original = body_of(declaration, "poison", "db-0")
    edit_id = edited(declaration, log)
    assert not enqueue(declaration, "q", [{"message_id": "new-1", "message_type": "t", "body": {}}]).refused
    result = undo_action(declaration, edit_id)
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 1, [])
    assert body_of(declaration, "poison", "db-0") == original
    assert [r["message_id"] for r in rows(declaration, "inbound")] == ["new-1"]
    assert find_action(QueueTables.of(declaration, "q"), edit_id).state == UNDONE
    assert undo_action(declaration, edit_id).already_undone


def test_undo_of_an_edit_already_processed_names_it(spark, lake):  # noqa: F811
    declaration, log = lake
    edit_id = edited(declaration, log)
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration)["db-0"] == ["processed:processed"]
    result = undo_action(declaration, edit_id)
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 0, ["db-0"])
    assert places(declaration)["db-0"] == ["processed:processed"]
    assert find_action(QueueTables.of(declaration, "q"), edit_id).state == UNDONE


def test_undo_of_an_edit_killed_before_it_marked_the_edit_completes_once(lake, monkeypatch):  # noqa: F811
    declaration, log = lake
    original = body_of(declaration, "poison", "db-0")
    edit_id = edited(declaration, log)
    real = undo_module.mark_undone

    def die_on_the_edit(writer, action):
        if action.kind == "edit":
            raise Crash
        return real(writer, action)

    monkeypatch.setattr(undo_module, "mark_undone", die_on_the_edit)
    with pytest.raises(Crash):
        undo_action(declaration, edit_id)
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, f"{edit_id}--redrive").state == UNDONE
    assert find_action(tables, edit_id).state == DONE
    monkeypatch.setattr(undo_module, "mark_undone", real)
    result = undo_action(declaration, edit_id)
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 1, [])
    assert find_action(tables, edit_id).state == UNDONE
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2", "own-1"]
    assert body_of(declaration, "poison", "db-0") == original
    assert rows(declaration, "inbound") == []


# Vacuumed purges: what time travel can still read comes back, the rest is named with the reason.


def _files_holding(declaration, table: str, version: int, message_id: str) -> list[str]:
    """The files of `table` at `version` that hold a row of `message_id`."""
    old = DeltaTable(QueueTables.of(declaration, "q").uri(table), version=version)
    paths = [uri.removeprefix("file://") for uri in old.file_uris()]
    return [p for p in paths if message_id in pq.read_table(p, columns=["message_id"])["message_id"].to_pylist()]


def test_undo_of_a_partly_vacuumed_purge_brings_back_what_it_can_read_and_names_the_rest(spark, lake):  # noqa: F811
    declaration, _ = lake
    assert not enqueue(declaration, "q", [{"message_id": "late-1", "message_type": "withdrawal",
                                           "body": {"fail": True}}]).refused
    run_cycle(spark, declaration, "q", "inbound")  # a second batch in poison, in a file of its own
    done = purge_table(declaration, "q", "poison", "1h", WITHDRAWALS, now=datetime.now(UTC) + LATER)
    assert poison_ids(declaration) == ["own-1"] and len(purged(declaration)) == 4
    tables = QueueTables.of(declaration, "q")
    before = find_action(tables, done.action_id).versions["q/poison"]["before"]
    # A vacuum that stopped half way (or a lifecycle rule of the object store) deleted the file that
    # held db-0..2 before the purge; late-1's is still there. No commit records it.
    (gone,) = _files_holding(declaration, "poison", before, "db-0")
    assert _files_holding(declaration, "poison", before, "late-1") != [gone]
    os.remove(gone)
    result = undo_action(declaration, done.action_id)
    # Nothing committed since the purge, but a RESTORE to a version with a file missing would fail (or
    # leave a table pointing at nothing): the undo compensates instead.
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 1, ["db-0", "db-1", "db-2"])
    ((why, which),) = result.unrecoverable_reasons.items()
    assert which == ["db-0", "db-1", "db-2"] and "vacuum deleted" in why and f"version {before}" in why
    assert poison_ids(declaration) == ["late-1", "own-1"]
    # What cannot come back stays purged: the ledger still says so, and the line balances.
    assert purged(declaration) == [(f"db-{i}", done.action_id) for i in range(3)]
    balanced(declaration, received=5)
    assert find_action(tables, done.action_id).state == UNDONE
    assert "3 cannot come back: their rows were in 1 file(s) of q/poison" in format_undo(result)
    after = table_versions(declaration)
    assert undo_action(declaration, done.action_id).already_undone
    assert table_versions(declaration) == after


def test_undo_of_a_purge_whose_files_are_all_gone_refuses_even_with_no_commit_since(lake):  # noqa: F811
    declaration, _ = lake
    done = purge_table(declaration, "q", "poison", "1h", WITHDRAWALS, now=datetime.now(UTC) + LATER)
    tables = QueueTables.of(declaration, "q")
    before = find_action(tables, done.action_id).versions["q/poison"]["before"]
    for path in _files_holding(declaration, "poison", before, "db-0"):
        os.remove(path)
    versions = table_versions(declaration)
    with pytest.raises(UndoError, match=r"none of its 3 message\(s\) can come back .*vacuum deleted.*"
                                        r"db-0, db-1, db-2\)\. Nothing was changed"):
        undo_action(declaration, done.action_id)
    assert table_versions(declaration) == versions
    assert find_action(tables, done.action_id).state == DONE
    assert poison_ids(declaration) == ["own-1"]
    balanced(declaration)


# The command, run as operators run it: the console script, one process per command.

COMMAND = Path(sys.executable).with_name("poison-pipeline")
REPO = Path(__file__).resolve().parents[1]


def _config(declaration: Declaration, folder: Path) -> Path:
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    return config


def command(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The declaration names the tests' handlers: the command must be able to import them.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([str(COMMAND), "--config", str(config), *args], capture_output=True, text=True,
                          env=env, timeout=180)


def test_the_command_undoes_a_purge_and_refuses_bad_input_changing_nothing(lake, tmp_path):  # noqa: F811
    declaration, _ = lake
    config = _config(declaration, tmp_path)
    done = purge_table(declaration, "q", "poison", "1h", WITHDRAWALS, now=datetime.now(UTC) + LATER)
    tables = QueueTables.of(declaration, "q")
    with queue_writer(tables, "test") as writer:
        begin_action(writer, "redrive", "dave", {"from": "poison"}, [(tables, "poison")], action_id="half-done")
    versions = table_versions(declaration)
    for args, problem in ((["nope"], "undo: error: no action 'nope' is recorded (see `poison-pipeline actions`)"),
                          (["half-done"], "action 'half-done' is planned: run it again with its id to complete "
                                          "it before undoing it")):
        refused = command(config, "undo", *args)
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        assert problem in refused.stderr
        assert table_versions(declaration) == versions
    assert find_action(tables, "half-done").state == PLANNED

    ran = command(config, "undo", done.action_id, "--json", "--actor", "carol")
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert list(out) == ["undo_id", "action_id", "kind", "how", "restored", "unrecoverable", "already_undone",
                         "unrecoverable_reasons"]
    assert (out["kind"], out["how"], out["restored"], out["unrecoverable"]) == ("purge", "restore", 3, [])
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2", "own-1"] and purged(declaration) == []
    balanced(declaration)
    assert find_action(tables, out["undo_id"]).actor == "carol"

    versions = table_versions(declaration)
    again = command(config, "undo", done.action_id)
    assert (again.returncode, again.stdout.strip()) == (0, f"action {done.action_id} was undone already: "
                                                           "nothing changed"), again.stderr
    not_undoable = command(config, "undo", out["undo_id"])
    assert not_undoable.returncode == 2
    assert (f"action '{out['undo_id']}' is of kind 'undo', which cannot be undone (undo reverses archive, edit, "
            "purge, redrive, restore)") in not_undoable.stderr
    assert table_versions(declaration) == versions


def test_the_command_undoes_edits_and_names_the_one_already_processed(spark, lake, tmp_path):  # noqa: F811
    declaration, log = lake
    config = _config(declaration, tmp_path)
    originals = {m: body_of(declaration, "poison", m) for m in ("db-0", "db-1")}
    first = edit_message(declaration, "db-0", json.dumps({"log": str(log)}).encode()).edit_id
    run_cycle(spark, declaration, "q", "inbound")  # the edited db-0 is processed
    second = edit_message(declaration, "db-1", json.dumps({"log": str(log)}).encode()).edit_id

    ran = command(config, "undo", second)
    assert ran.returncode == 0, ran.stderr
    assert f"undid edit {second} by compensate ({second}--undo): 1 message(s) back where they were" in ran.stdout
    assert body_of(declaration, "poison", "db-1") == originals["db-1"]

    late = command(config, "undo", first, "--json")  # db-0 was processed since: it cannot come back
    assert late.returncode == 1, late.stderr
    out = json.loads(late.stdout)
    assert (out["how"], out["restored"], out["unrecoverable"]) == ("compensate", 0, ["db-0"])
    assert out["unrecoverable_reasons"] == {"already processed by q": ["db-0"]}
    assert places(declaration)["db-0"] == ["processed:processed"]
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, first).state == UNDONE and find_action(tables, second).state == UNDONE
    assert [e["edit_id"] for e in edits_of(declaration, "db-0")] == [first]  # the history stays


class _Killed(Exception):
    pass


def test_an_undo_of_a_redrive_to_another_queue_killed_before_its_removal_leaves_no_copy_to_deliver(
        spark, lake, monkeypatch):  # noqa: F811
    """Killed after the messages went back, before they left the other queue's inbound: that queue's
    own cycles (which do not complete another queue's undo) leave its copies alone, and the undo run
    again removes them: every message in one place."""
    declaration, _ = lake
    redrive_table(declaration, "q", "poison", Selection(ids=("db-1", "db-2")), to="other", redrive_id="r1")
    assert places(declaration, "other") == {"db-1": ["inbound"], "db-2": ["inbound"]}
    real = QueueWriter.replace_batches

    def removal_killed(self: QueueWriter, table: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("add") is None:  # the removal, not the hold
            raise _Killed("killed before the removal")
        return real(self, table, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(QueueWriter, "replace_batches", removal_killed)
        with pytest.raises(_Killed):
            undo_action(declaration, "r1")
    assert sorted(r["message_id"] for r in rows(declaration, "poison")) == ["db-0", "db-1", "db-2", "own-1"]
    report = run_cycle(spark, declaration, "other", "inbound")
    assert report.skipped == "no message is due", report.counts  # the copies wait for the undo
    assert sorted(r["message_id"] for r in rows(declaration, "inbound", "other")) == ["db-1", "db-2"]
    assert undo_action(declaration, "r1").restored == 2
    where = places(declaration)
    assert {m: where[m] for m in ("db-1", "db-2")} == {"db-1": ["poison"], "db-2": ["poison"]}
    assert places(declaration, "other") == {}


def test_an_interrupted_undo_whose_completion_fails_is_left_for_the_operator_and_the_queue_goes_on(
        spark, lake, monkeypatch):  # noqa: F811
    """An undo of a restore whose completion keeps failing with an error that is none of the
    product's own (the files of a version gone): every cycle and command of the queue goes on, and
    the action stays `planned` with the reason it was left recorded, once."""
    declaration, _ = lake
    tables = QueueTables.of(declaration, "q")
    archive(declaration, ArchiveRequest(queue="q", table="poison", ids=["db-0"], id="a1"))
    restore(declaration, RestoreRequest(queue="q", table="poison", ids=["db-0"], id="r1"))

    def files_gone(*args: Any, **kwargs: Any) -> int:
        raise FileNotFoundError("part-00001.parquet of q/archived: not found")

    monkeypatch.setattr(undo_module.archiving, "reverse", files_gone)
    with pytest.raises(FileNotFoundError):
        undo_action(declaration, "r1")
    assert find_action(tables, "r1--undo").state == PLANNED
    assert not enqueue(declaration, "q", [{"message_id": "good-1", "message_type": "refund", "body": {}}]).refused

    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts.get("processed") == 1 and places(declaration)["good-1"] == ["processed:processed"]
    assert report.interrupted.left["r1--undo"].startswith("FileNotFoundError: part-00001.parquet")
    left = find_action(tables, "r1--undo")
    assert left.state == PLANNED and left.counts["left"] == report.interrupted.left["r1--undo"]
    ledger = tables.open("actions").version()
    assert run_cycle(spark, declaration, "q", "inbound").interrupted.left == report.interrupted.left
    assert tables.open("actions").version() == ledger  # the same reason is not written again
    # The alert: one action_left event, which the queue's action_left sensor raises.
    alerts = decide_alerts(tables, {}, ACTION_LEFT).events
    assert len(alerts) == 1 and "r1--undo" in alerts[0].describe() and "FileNotFoundError" in alerts[0].describe()
    # An operator command of the queue goes on too.
    assert purge_table(declaration, "q", "poison", 0, Selection(ids=("own-1",))).purged == 1
    monkeypatch.undo()  # the files are back: the next holder completes it
    assert run_cycle(spark, declaration, "q", "inbound").interrupted.completed == ["r1--undo"]
    assert find_action(tables, "r1").state == UNDONE
