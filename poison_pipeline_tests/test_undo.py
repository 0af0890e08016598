"""Undo of a redrive, a purge or an edit: by restoring the recorded versions when nothing touched the
tables since, by moving back what is still where the action put it otherwise, naming what cannot
come back; run again, nothing changes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from deltalake import DeltaTable

from poison_pipeline.engine.cycle import run_cycle
from poison_pipeline.operations import undo as undo_module
from poison_pipeline.operations.actions import DONE, UNDONE, find_action
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.edit import edit, edits_of
from poison_pipeline.operations.purge import purge
from poison_pipeline.operations.redrive import redrive
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import UndoError, undo
from poison_pipeline.storage.enqueue import enqueue
from poison_pipeline.storage.tables import PURGED, QueueTables
from poison_pipeline_tests.support import places, rows, table_versions
from poison_pipeline_tests.test_redrive import lake  # noqa: F401 - the shared fixture

WITHDRAWALS = Selection(message_type="withdrawal")


def poison_ids(declaration) -> list[str]:
    return sorted(r["message_id"] for r in rows(declaration, "poison"))


def test_undo_right_after_a_redrive_restores_the_versions_before_it(lake):  # noqa: F811
    declaration, _ = lake
    before = rows(declaration, "poison")
    done = redrive(declaration, "q", "poison", WITHDRAWALS)
    result = undo(declaration, done.action_id, actor="carol")
    assert (result.how, result.restored, result.unrecoverable) == ("restore", 3, [])
    assert sorted(map(str, rows(declaration, "poison"))) == sorted(map(str, before))
    assert rows(declaration, "inbound") == []
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, done.action_id).state == UNDONE
    assert find_action(tables, result.undo_id).actor == "carol"
    assert undo(declaration, done.action_id).already_undone


def test_undo_after_later_commits_moves_back_what_is_still_there_and_names_the_rest(spark, lake):  # noqa: F811
    declaration, _ = lake
    now = datetime.now(UTC)
    done = redrive(declaration, "q", "poison", WITHDRAWALS, rate=0.05, now=now)  # db-0 due now, the others later
    assert not enqueue(declaration, "q", [{"message_id": "new-1", "message_type": "t", "body": {}}]).refused
    run_cycle(spark, declaration, "q", "inbound", now=now + timedelta(seconds=1))  # processes db-0 and new-1
    result = undo(declaration, done.action_id)
    assert result.how == "compensate"
    assert (result.restored, result.unrecoverable) == (2, ["db-0"])
    assert poison_ids(declaration) == ["db-1", "db-2", "own-1"]
    where = places(declaration)
    assert where["db-0"] == ["processed:processed"] and where["new-1"] == ["processed:processed"]
    assert rows(declaration, "inbound") == []
    # Run again: nothing moves twice.
    assert undo(declaration, done.action_id).already_undone
    assert poison_ids(declaration) == ["db-1", "db-2", "own-1"]


def test_undo_refuses_what_it_cannot_undo(lake):  # noqa: F811
    declaration, _ = lake
    with pytest.raises(UndoError, match="no action 'nope' is recorded"):
        undo(declaration, "nope")
    done = redrive(declaration, "q", "poison", WITHDRAWALS)
    reverse = undo(declaration, done.action_id)
    with pytest.raises(UndoError, match="is of kind 'undo', which cannot be undone"):
        undo(declaration, reverse.undo_id)


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
    done = purge(declaration, "q", "poison", "1h", WITHDRAWALS, now=datetime.now(UTC) + LATER)
    assert poison_ids(declaration) == ["own-1"] and len(purged(declaration)) == 3
    result = undo(declaration, done.action_id, actor="carol")
    assert (result.kind, result.how, result.restored, result.unrecoverable) == ("purge", "restore", 3, [])
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2", "own-1"]
    assert purged(declaration) == []
    balanced(declaration)
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, done.action_id).state == UNDONE
    assert find_action(tables, result.undo_id).state == DONE
    before = table_versions(declaration)
    assert undo(declaration, done.action_id).already_undone
    assert table_versions(declaration) == before


def test_undo_of_a_purge_after_another_purge_appends_back_and_balances(lake, monkeypatch):  # noqa: F811
    declaration, _ = lake
    later = datetime.now(UTC) + LATER
    first = purge(declaration, "q", "poison", "1h", WITHDRAWALS, now=later)
    second = purge(declaration, "q", "poison", "1h", Selection(message_type="refund"), now=later)
    assert poison_ids(declaration) == [] and len(purged(declaration)) == 4
    balanced(declaration)
    # Killed after it changed the tables, before it marked the purge undone: run again, nothing twice.
    real = undo_module.mark_undone

    def die(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(undo_module, "mark_undone", die)
    with pytest.raises(Crash):
        undo(declaration, first.action_id)
    monkeypatch.setattr(undo_module, "mark_undone", real)
    result = undo(declaration, first.action_id)
    assert (result.how, result.unrecoverable) == ("compensate", [])
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2"]
    assert [r["body"] for r in rows(declaration, "poison")] != [None] * 3
    assert purged(declaration) == [("own-1", second.action_id)]
    balanced(declaration)
    assert find_action(QueueTables.of(declaration, "q"), first.action_id).state == UNDONE
    before = table_versions(declaration)
    assert undo(declaration, first.action_id).already_undone
    assert table_versions(declaration) == before


def test_undo_of_a_purge_whose_files_were_vacuumed_names_them_and_changes_nothing(lake):  # noqa: F811
    declaration, _ = lake
    later = datetime.now(UTC) + LATER
    first = purge(declaration, "q", "poison", "1h", WITHDRAWALS, now=later)
    purge(declaration, "q", "poison", "1h", Selection(message_type="refund"), now=later)
    tables = QueueTables.of(declaration, "q")
    DeltaTable(tables.uri("poison")).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    before = table_versions(declaration)
    with pytest.raises(UndoError, match=r"vacuum.*db-0, db-1, db-2"):
        undo(declaration, first.action_id)
    assert table_versions(declaration) == before
    assert find_action(tables, first.action_id).state == DONE
    balanced(declaration)


# Edit


def body_of(declaration, table: str, message_id: str) -> bytes:
    (row,) = [r for r in rows(declaration, table) if r["message_id"] == message_id]
    return row["body"]


def edited(declaration, log) -> str:
    result = edit(declaration, "db-0", json.dumps({"log": str(log)}).encode(), {"fixed-by": "alice"})
    assert result.moved == 1
    return result.edit_id


def test_undo_right_after_an_edit_brings_the_original_body_back_and_keeps_the_edit(lake):  # noqa: F811
    declaration, log = lake
    original = body_of(declaration, "poison", "db-0")
    edit_id = edited(declaration, log)
    result = undo(declaration, edit_id)
    assert (result.kind, result.how, result.restored, result.unrecoverable) == ("edit", "restore", 1, [])
    assert body_of(declaration, "poison", "db-0") == original
    assert rows(declaration, "inbound") == []
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, edit_id).state == UNDONE
    assert find_action(tables, f"{edit_id}-redrive").state == UNDONE
    assert [e["edit_id"] for e in edits_of(declaration, "db-0")] == [edit_id]  # history stays
    before = table_versions(declaration)
    assert undo(declaration, edit_id).already_undone
    assert table_versions(declaration) == before


def test_undo_of_an_edit_after_an_enqueue_moves_the_message_back(lake):  # noqa: F811
    declaration, log = lake
    original = body_of(declaration, "poison", "db-0")
    edit_id = edited(declaration, log)
    assert not enqueue(declaration, "q", [{"message_id": "new-1", "message_type": "t", "body": {}}]).refused
    result = undo(declaration, edit_id)
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 1, [])
    assert body_of(declaration, "poison", "db-0") == original
    assert [r["message_id"] for r in rows(declaration, "inbound")] == ["new-1"]
    assert find_action(QueueTables.of(declaration, "q"), edit_id).state == UNDONE
    assert undo(declaration, edit_id).already_undone


def test_undo_of_an_edit_already_processed_names_it(spark, lake):  # noqa: F811
    declaration, log = lake
    edit_id = edited(declaration, log)
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration)["db-0"] == ["processed:processed"]
    result = undo(declaration, edit_id)
    assert (result.how, result.restored, result.unrecoverable) == ("compensate", 0, ["db-0"])
    assert places(declaration)["db-0"] == ["processed:processed"]
    assert find_action(QueueTables.of(declaration, "q"), edit_id).state == UNDONE


def test_undo_of_an_edit_killed_before_it_marked_the_edit_completes_once(lake, monkeypatch):  # noqa: F811
    declaration, log = lake
    original = body_of(declaration, "poison", "db-0")
    edit_id = edited(declaration, log)
    real = undo_module.mark_undone

    def die_on_the_edit(tables, action):
        if action.kind == "edit":
            raise Crash
        return real(tables, action)

    monkeypatch.setattr(undo_module, "mark_undone", die_on_the_edit)
    with pytest.raises(Crash):
        undo(declaration, edit_id)
    tables = QueueTables.of(declaration, "q")
    assert find_action(tables, f"{edit_id}-redrive").state == UNDONE
    assert find_action(tables, edit_id).state == DONE
    monkeypatch.setattr(undo_module, "mark_undone", real)
    result = undo(declaration, edit_id)
    assert (result.how, result.restored, result.unrecoverable) == ("restore", 1, [])
    assert find_action(tables, edit_id).state == UNDONE
    assert poison_ids(declaration) == ["db-0", "db-1", "db-2", "own-1"]
    assert body_of(declaration, "poison", "db-0") == original
    assert rows(declaration, "inbound") == []
