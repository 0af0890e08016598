"""The actions ledger: every operator action is one row per queue (who, when, arguments, state,
counts, and the Delta versions of the tables it touched), listed by `poison-pipeline actions`."""

from __future__ import annotations

import json

import pytest

from poison_pipeline import cli
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.actions import DONE, KINDS, PLANNED, RESUMABLE, begin_action, find_action, list_actions
from poison_pipeline.operations.interrupted import COMPLETIONS
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline.storage.writer import queue_writer
from poison_pipeline_tests.test_cli import write_config, write_jsonl


def test_enable_and_end_conversation_are_recorded_with_actor_counts_and_versions(tmp_path, capsys):
    config = write_config(tmp_path)
    declaration = load_declaration(config)
    tables = QueueTables.of(declaration, "q")
    set_enabled(tables, False, "poison_pipeline", "message m faulted")
    events_before = tables.open(EVENTS).version()
    write_jsonl(tmp_path / "c.jsonl", {"message_id": "m1", "message_type": "order", "body": {},
                                       "conversation_id": "c-1"})
    run = ["--config", str(config)]
    assert cli.main([*run, "enqueue", str(tmp_path / "c.jsonl"), "--queue", "q"]) == 0
    assert cli.main([*run, "enable", "q", "--actor", "alice", "--reason", "db is back"]) == 0
    assert cli.main([*run, "end-conversation", "c-1", "--code", "42", "--description", "gone", "--actor", "bob"]) == 0
    capsys.readouterr()

    enabled, ended = list_actions(declaration, "q")
    assert (enabled.kind, enabled.actor, enabled.state, enabled.arguments) == ("enable", "alice", DONE,
                                                                             {"reason": "db is back"})
    assert enabled.counts == {"changed": True}
    assert enabled.versions["q/events"] == {"before": events_before, "after": events_before + 1}
    assert (ended.kind, ended.actor, ended.counts["removed"]) == ("end_conversation", "bob", 1)
    assert ended.arguments == {"conversation_id": "c-1", "code": 42, "description": "gone"}

    assert cli.main([*run, "actions", "--queue", "q", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["kind"] for a in listed] == ["enable", "end_conversation"]
    assert listed[0]["action_id"] == enabled.action_id and listed[0]["state"] == "done"
    assert cli.main([*run, "actions"]) == 0
    table = capsys.readouterr().out
    assert enabled.action_id in table and "alice" in table and "end_conversation" in table


def test_beginning_an_action_again_with_its_id_returns_the_recorded_one(tmp_path):
    tables = QueueTables.of(load_declaration(write_config(tmp_path)), "q")
    with queue_writer(tables, "test") as writer:
        first = begin_action(writer, "redrive", "alice", {"from": "poison"}, [(tables, "poison")], action_id="r-1")
        again = begin_action(writer, "redrive", "bob", {"from": "dead_letter"}, [], action_id="r-1")
    assert again == first and find_action(tables, "r-1").state == PLANNED
    assert len(tables.open("actions").to_pyarrow_table()) == 1


def test_every_resumable_kind_has_its_completion_and_an_undeclared_kind_is_not_recorded(tmp_path):
    assert list(COMPLETIONS) == list(RESUMABLE) and set(RESUMABLE) <= set(KINDS)
    tables = QueueTables.of(load_declaration(write_config(tmp_path)), "q")
    with queue_writer(tables, "test") as writer, pytest.raises(ValueError, match="action kind 'rename' is not"):
        begin_action(writer, "rename", "alice", {}, [], action_id="a-1")
    assert find_action(tables, "a-1") is None
