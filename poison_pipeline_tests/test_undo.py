"""Undo of a redrive: by restoring the recorded versions when nothing touched the tables since, by
moving back what is still where the redrive put it otherwise, naming what cannot come back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from poison_pipeline.engine.cycle import run_cycle
from poison_pipeline.operations.actions import UNDONE, find_action
from poison_pipeline.operations.redrive import redrive
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import UndoError, undo
from poison_pipeline.storage.enqueue import enqueue
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import places, rows
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
    with pytest.raises(UndoError, match="is a undo, which cannot be undone"):
        undo(declaration, reverse.undo_id)
