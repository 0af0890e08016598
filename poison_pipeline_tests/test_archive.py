"""Archive and restore: a reversible "known, ignore it" state, apart from purge."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline import cli
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.actions import DONE, PLANNED, UNDONE, Recorded, find_action
from poison_pipeline.operations.archive import ArchiveRequest, RestoreRequest, apply_retention, archive, restore
from poison_pipeline.operations.checks import POISON_GROWTH, check_conservation, check_growth
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.operations.history import history
from poison_pipeline.operations.inspect_message import inspect_message
from poison_pipeline.operations.undo import UndoRequest, undo
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Committer
from poison_pipeline_tests.support import HANDLER, places, send, table_versions

QUEUE = {"handler": HANDLER, "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
                                        "receive_error_handling": "move"}}


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


@pytest.fixture
def lake(spark, tmp_path: Path) -> Path:
    """Queue q: `bad-0`, `bad-1` (one failure group) and `odd` (another) in poison, `ok` processed."""
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": QUEUE}}))
    declaration = load_declaration(str(config))
    send(declaration, {"bad-0": {"fail": True}, "bad-1": {"fail": True}, "odd": {"fail_until_attempt": 9}, "ok": {}})
    run_cycle(spark, declaration, "q", "inbound")
    return config


def balanced(config: Path) -> None:
    tables = QueueTables.of(load_declaration(str(config)), "q")
    outcome = check_conservation(tables)
    assert outcome.passed, outcome.description


def group_of(config: Path, message_type_error: str) -> str:
    return next(g.id for g in failure_groups(load_declaration(str(config)), "q")
                if (g.error_type or "").endswith(message_type_error))


def test_archive_leaves_groups_checks_and_selections_restore_and_undo_bring_them_back(lake, capsys):
    declaration = load_declaration(str(lake))
    tables = QueueTables.of(declaration, "q")
    bad = group_of(lake, "ValueError")
    base = ["--config", str(lake)]
    assert cli.main([*base, "archive", "q", "--table", "poison", "--group", bad, "--actor", "alice", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["kind"], done["count"], done["by_group"]) == ("archive", 2, {bad: 2})
    # Still in poison, readable; out of groups, the growth check and redrive's selection.
    assert places(declaration)["bad-0"] == ["poison"]
    assert [g.id for g in failure_groups(declaration, "q")] != [] and bad not in [
        g.id for g in failure_groups(declaration, "q")]
    line = conservation(tables)
    assert (line.poison, line.archived) == (1, 2) and "2 archived" in line.line()
    balanced(lake)
    assert check_growth(tables, POISON_GROWTH, 0, None).metadata["rows"] == 1
    [where] = inspect_message(declaration, "bad-0").locations
    assert where.archived_by == done["action_id"]
    assert "archived" in [e.kind for e in history(declaration, "bad-0").events]
    assert cli.main([*base, "inspect", "bad-0"]) == 0
    assert "archived at" in capsys.readouterr().out
    assert cli.main([*base, "redrive", "q", "--from", "poison", "--error-type", "ValueError"]) == 1
    capsys.readouterr()

    restored = restore(declaration, RestoreRequest(queue="q", table="poison", ids=["bad-1"]))
    assert restored.count == 1 and conservation(tables).archived == 1
    balanced(lake)
    # Undo the restore: archived again; undo the archive: both failures like any other.
    assert undo(declaration, UndoRequest(action_id=restored.action_id)).restored == 1
    assert conservation(tables).archived == 2
    balanced(lake)
    assert undo(declaration, UndoRequest(action_id=done["action_id"])).restored == 2
    line = conservation(tables)
    assert (line.poison, line.archived) == (3, 0)
    assert bad in [g.id for g in failure_groups(declaration, "q")]
    assert find_action(tables, done["action_id"]).state == UNDONE
    balanced(lake)


def test_a_killed_archive_is_completed_by_the_queues_next_holder_once(spark, lake, monkeypatch):
    declaration = load_declaration(str(lake))
    tables = QueueTables.of(declaration, "q")
    original = Committer.append

    def die(self: Any, table: str, *args: Any, **kwargs: Any) -> Any:
        if table == "archived":
            raise Crash("killed before the markers were committed")
        return original(self, table, *args, **kwargs)

    monkeypatch.setattr(Committer, "append", die)
    with pytest.raises(Crash):
        archive(declaration, ArchiveRequest(queue="q", table="poison", error_type="ValueError", id="a1"))
    monkeypatch.setattr(Committer, "append", original)
    assert find_action(tables, "a1").state == PLANNED and conservation(tables).archived == 0
    run_cycle(spark, declaration, "q", "inbound")  # the queue's next holder completes it
    assert find_action(tables, "a1").state == DONE and conservation(tables).archived == 2
    again = archive(declaration, ArchiveRequest(queue="q", table="poison", error_type="ValueError", id="a1"))
    assert again.already_done and conservation(tables).archived == 2
    balanced(lake)


def test_a_killed_restore_run_again_by_its_id_completes(lake, monkeypatch):
    declaration = load_declaration(str(lake))
    tables = QueueTables.of(declaration, "q")
    archive(declaration, ArchiveRequest(queue="q", table="poison"))
    original = Recorded.finish

    def die(self: Recorded, *args: Any, **kwargs: Any) -> Any:
        raise Crash("killed before it was recorded done")

    monkeypatch.setattr(Recorded, "finish", die)
    with pytest.raises(Crash):
        restore(declaration, RestoreRequest(queue="q", table="poison", id="r1"))
    monkeypatch.setattr(Recorded, "finish", original)
    assert conservation(tables).archived == 0 and find_action(tables, "r1").state == PLANNED
    result = restore(declaration, RestoreRequest(queue="q", table="poison", id="r1"))
    assert find_action(tables, "r1").state == DONE and result.count == 3 and not result.already_done
    balanced(lake)


def test_the_archives_own_retention_purges_what_was_archived_long_enough_ago(lake):
    config = yaml.safe_load(lake.read_text())
    config["queues"]["q"]["retention"] = {"archived": "7d", "poison": "30d"}
    lake.write_text(yaml.safe_dump(config))
    declaration = load_declaration(str(lake))
    archive(declaration, ArchiveRequest(queue="q", table="poison", ids=["odd"]))
    results = apply_retention(declaration, "q", now=datetime.now(UTC) + timedelta(days=8))
    # `odd` was archived 8 days before: purged. bad-0 and bad-1 failed 8 days before, not 30: kept.
    assert sorted((r.table, r.purged) for r in results) == [("poison", 0), ("poison", 1)]
    assert "odd" not in places(declaration) and places(declaration)["bad-0"] == ["poison"]
    balanced(lake)


@pytest.mark.parametrize(("arguments", "says"), [
    (["archive", "q", "--table", "inbound"], "invalid choice"),
    (["archive", "nope", "--table", "poison"], "no queue 'nope'"),
    (["archive", "q", "--table", "poison", "--where", "1=0) --"], "--where"),
    (["restore", "q", "--table", "poison"], "nothing to restore"),
])
def test_a_bad_archive_or_restore_is_refused_and_changes_nothing(lake, capsys, arguments, says):
    declaration = load_declaration(str(lake))
    before = table_versions(declaration)
    code = cli.main(["--config", str(lake), *arguments])
    assert code == (1 if "nothing" in says else 2)
    assert says in capsys.readouterr().err
    assert table_versions(declaration) == before
