"""Notes on failure groups: recorded in the actions ledger, shown by `groups` and in Dagster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from poison_pipeline import cli
from poison_pipeline.defs.failure_metadata import failure_group_metadata
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.actions import list_actions
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline_tests.support import HANDLER, send, table_versions

QUEUE = {"handler": HANDLER, "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
                                        "receive_error_handling": "move"}}


@pytest.fixture
def lake(spark, tmp_path: Path) -> Path:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": QUEUE, "empty": QUEUE}}))
    declaration = load_declaration(str(config))
    send(declaration, {"a-1": {"fail": True}, "a-2": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    return config


def test_a_note_is_recorded_and_shown_with_its_group_the_newest_first(lake, capsys):
    declaration = load_declaration(str(lake))
    [group] = failure_groups(declaration, "q")
    base = ["--config", str(lake), "groups"]
    assert cli.main([*base, "note", group.as_of, "looking into it", "--actor", "alice"]) == 0
    assert cli.main([*base, "note", group.id, "payments bug, fix on Monday", "--owner", "bob",
                     "--actor", "carol", "--json"]) == 0
    noted = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    notes = [a for a in list_actions(declaration, "q") if a.kind == "note"]
    assert [(a.actor, a.arguments["text"], a.arguments["owner"], a.state) for a in notes] == [
        ("alice", "looking into it", None, "done"), ("carol", "payments bug, fix on Monday", "bob", "done")]
    assert noted == {"group": group.id, "action_ids": {"q": notes[-1].action_id}}

    [group] = failure_groups(declaration, "q")
    assert (group.note.text, group.note.owner, group.note.actor) == ("payments bug, fix on Monday", "bob", "carol")
    assert cli.main([*base, "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)["groups"]
    assert shown["note"]["text"] == "payments bug, fix on Monday" and shown["note"]["owner"] == "bob"
    assert cli.main(base) == 0
    assert "note: payments bug, fix on Monday (owner: bob) - carol" in capsys.readouterr().out
    assert "payments bug, fix on Monday (owner: bob)" in failure_group_metadata([group])["failure_groups_top"].value
    assert cli.main(["--config", str(lake), "actions", "--queue", "q"]) == 0
    assert "note" in capsys.readouterr().out


@pytest.mark.parametrize(("arguments", "says"), [
    (["note", "0000beef", "what?"], "failure group '0000beef': no failure table of queues empty, q holds it"),
    (["note", "{group}", "  "], "TEXT"),
    (["note", "{group}", "x", "--queue", "empty"], "no failure table of queue 'empty' holds it"),
    (["note", "{group}", "x", "--queue", "nope"], "no queue 'nope' is declared"),
])
def test_a_note_on_an_unknown_group_or_without_text_is_refused_and_changes_nothing(lake, capsys, arguments, says):
    declaration = load_declaration(str(lake))
    [group] = failure_groups(declaration, "q")
    before = table_versions(declaration)
    assert cli.main(["--config", str(lake), "groups", *(a.format(group=group.id) for a in arguments)]) == 2
    assert says in capsys.readouterr().err
    assert table_versions(declaration) == before
