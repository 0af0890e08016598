"""A cut-off for group actions: `groups` shows the versions it read; `redrive`, `purge` and a group id
with `@VERSION` act only on the failures present in that snapshot, not on those committed since."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from poison_pipeline import cli
from poison_pipeline.defs.failure_metadata import failure_group_metadata
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import HANDLER, places, send, table_versions

QUEUE = {"handler": HANDLER, "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
                                        "receive_error_handling": "move"}}


@pytest.fixture
def lake(spark, tmp_path: Path) -> Path:
    """Queue q: a-1 and a-2 failed, then `groups` was read; then a-3 failed the same way."""
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": QUEUE}}))
    declaration = load_declaration(str(config))
    send(declaration, {"a-1": {"fail": True}, "a-2": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    return config


def groups_json(config: Path, capsys) -> list[dict]:
    assert cli.main(["--config", str(config), "groups", "--table", "poison", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["groups"]


def fail_another(spark, config: Path) -> None:
    declaration = load_declaration(str(config))
    send(declaration, {"a-3": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")


def test_groups_shows_the_version_it_read_and_a_group_at_it_redrives_only_what_was_there(spark, lake, capsys):
    [group] = groups_json(lake, capsys)
    version = QueueTables.of(load_declaration(str(lake)), "q").open("poison").version()
    assert group["version"] == version and group["count"] == 2
    assert cli.main(["--config", str(lake), "groups"]) == 0
    text = capsys.readouterr().out
    assert f"{group['id']}@{version}" in text and f"read q/poison v{version}" in text

    fail_another(spark, lake)  # after the operator looked: same group, a later version
    assert cli.main(["--config", str(lake), "redrive", "q", "--from", "poison", "--group",
                     f"{group['id']}@{version}", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["moved"], result["source_version"]) == (2, version)
    where = places(load_declaration(str(lake)))
    assert where["a-1"] == where["a-2"] == ["inbound"] and where["a-3"] == ["poison"]


def test_as_of_version_cuts_off_a_purge_and_a_message_that_failed_again_since(spark, lake, capsys):
    [group] = groups_json(lake, capsys)
    fail_another(spark, lake)
    declaration = load_declaration(str(lake))
    # a-1 is sent back and fails again: it is in poison now, in another batch than the one the
    # operator saw. The purge of the snapshot leaves it, as it leaves a-3.
    assert cli.main(["--config", str(lake), "redrive", "q", "--from", "poison", "--ids", str(_ids(lake, "a-1"))]) == 0
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration)["a-1"] == ["poison"]
    capsys.readouterr()
    assert cli.main(["--config", str(lake), "purge", "q", "--table", "poison", "--older-than", "0",
                     "--as-of-version", str(group["version"]), "--group", group["id"], "--yes"]) == 0
    where = places(declaration)
    assert "a-2" not in where and where["a-1"] == where["a-3"] == ["poison"]


@pytest.mark.parametrize(("arguments", "says"), [
    (["redrive", "q", "--from", "poison", "--as-of-version", "99"], "--as-of-version 99: table poison of queue 'q'"),
    (["redrive", "q", "--from", "poison", "--from", "quarantine", "--as-of-version", "1"],
     "a version is one table's"),
    (["redrive", "q", "--from", "poison", "--group", "abcdef12@x"], "3fe6b38b@12"),
    (["redrive", "q", "--from", "poison", "--group", "abcdef12@1", "--as-of-version", "2"],
     "read at version 1, not at as_of_version 2"),
    (["purge", "q", "--table", "poison", "--older-than", "0", "--as-of-version", "-1", "--yes"], "--as-of-version"),
])
def test_a_bad_cut_off_is_refused_and_changes_nothing(lake, capsys, arguments, says):
    before = table_versions(load_declaration(str(lake)))
    assert cli.main(["--config", str(lake), *arguments]) == 2
    assert says in capsys.readouterr().err
    assert table_versions(load_declaration(str(lake))) == before


def test_the_dagster_failure_group_table_names_groups_with_their_version(lake):
    groups = failure_groups(load_declaration(str(lake)), "q", "poison")
    version = QueueTables.of(load_declaration(str(lake)), "q").open("poison").version()
    table = failure_group_metadata(groups)["failure_groups_top"].value
    assert f"| {groups[0].id}@{version} |" in table


def _ids(config: Path, *ids: str) -> Path:
    path = config.parent / "ids.txt"
    path.write_text("\n".join(ids))
    return path
