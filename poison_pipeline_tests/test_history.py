"""Message journey (issue 8 item 7): `history` puts everything that happened to a message on one
timeline; `inspect --as-of` shows a table's copy of it at an earlier version or time."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from poison_pipeline import cli
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import edit_message
from poison_pipeline.operations.history import history
from poison_pipeline.operations.inspect_message import AsOfError, inspect_message
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import table_versions

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 0, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "outage_threshold": 0}


@pytest.fixture
def journey(spark, make_declaration, tmp_path: Path):
    """m-1 fails while the database is down, goes to poison, is redriven by a filter once the
    database is back and is processed; m-2 always fails and stays in poison."""
    declaration = make_declaration({"q": {"handler": RECORDING, "policy": POLICY}})
    down = tmp_path / "down"
    down.touch()
    records = [{"message_id": "m-1", "message_type": "withdrawal", "body": {"down_if": str(down)}},
               {"message_id": "m-2", "message_type": "refund", "body": {"fail": True}}]
    assert not enqueue(declaration, "q", records).refused
    run_cycle(spark, declaration, "q", "inbound")
    poisoned_version = QueueTables.of(declaration, "q").open("poison").version()
    poisoned_at = datetime.now(UTC)
    time.sleep(0.05)
    down.unlink()
    result = redrive_table(declaration, "q", "poison", Selection(message_type="withdrawal"), actor="bob")
    run_cycle(spark, declaration, "q", "inbound")
    return declaration, result.action_id, poisoned_version, poisoned_at


def test_failed_poisoned_redriven_processed_in_order(journey):
    declaration, redrive_id, _, _ = journey
    events = history(declaration, "m-1").events
    kinds = [e.kind for e in events]
    assert kinds == ["enqueued", "attempt", "attempt", "moved", "redriven", "attempt", "processed"]
    first, second = events[1], events[2]
    assert (first.table, first.attempt, second.attempt) == ("inbound", 1, 2)
    assert first.error_type.endswith("DependencyDown") and first.run_id
    assert events[3].table == "poison" and events[3].from_table == "inbound" and events[3].inferred
    assert events[4].action_id == redrive_id and events[4].actor == "bob"
    assert events[5].outcome == "success" and events[6].table == "processed"
    # A cycle stamps its ledger row with its own start: the row still comes after the cycle's attempt.
    times = [e.at for e in events if e.kind != "processed"]
    assert times == sorted(times) and second.at >= first.at
    assert events[6].cycle_seq == events[5].cycle_seq


def test_edits_appear_on_the_timeline(spark, journey, tmp_path):
    declaration, _, _, _ = journey
    result = edit_message(declaration, "m-2", json.dumps({}).encode(), actor="carol")
    run_cycle(spark, declaration, "q", "inbound")
    events = history(declaration, "m-2").events
    kinds = [e.kind for e in events]
    assert kinds == ["enqueued", "attempt", "attempt", "moved", "edited", "redriven", "attempt", "processed"]
    edited = events[4]
    assert edited.action_id == result.edit_id and edited.actor == "carol"
    assert events[5].action_id == result.redrive_id


def test_an_undone_redrive_stays_on_the_timeline_with_its_undo(journey):
    declaration, _, _, _ = journey
    result = redrive_table(declaration, "q", "poison", Selection(message_type="refund"), actor="dave", redrive_id="fix")
    assert result.moved == 1
    undone = undo_action(declaration, "fix", actor="erin")
    assert undone.restored == 1
    events = history(declaration, "m-2").events
    redriven = [e for e in events if e.kind == "redriven"]
    assert [(e.action_id, e.actor) for e in redriven] == [("fix", "dave")]
    assert "(undone)" in redriven[0].detail
    [back] = [e for e in events if e.kind == "undone"]
    assert (back.actor, back.table, back.action_id) == ("erin", "poison", undone.undo_id)
    assert events.index(back) > events.index(redriven[0])
    # The other message's journey does not take this redrive for its own.
    assert "fix" not in [e.action_id for e in history(declaration, "m-1").events]


def test_inspect_as_of_shows_an_earlier_copy(journey):
    declaration, _, poisoned_version, poisoned_at = journey
    now = inspect_message(declaration, "m-1")
    assert [p.table for p in now.locations] == ["processed"]
    then = inspect_message(declaration, "m-1", as_of=poisoned_version, table="poison")
    assert [p.table for p in then.locations] == ["poison"] and then.as_of == f"version {poisoned_version} of poison"
    assert json.loads(then.envelope.raw_body)["down_if"]
    earlier = inspect_message(declaration, "m-1", as_of=poisoned_at)
    assert [p.table for p in earlier.locations] == ["poison"]
    assert len(earlier.attempts) == 2  # the attempts table as it was then
    with pytest.raises(AsOfError, match="needs --table"):
        inspect_message(declaration, "m-1", as_of=0)
    with pytest.raises(AsOfError, match="has versions 0 to"):
        inspect_message(declaration, "m-1", as_of=999, table="poison")
    for far in (10**15, 2**64):  # refused at once, not searched for commit by commit
        with pytest.raises(AsOfError, match=f"--as-of {far}: q/poison has versions 0 to"):
            inspect_message(declaration, "m-1", as_of=far, table="poison")


def test_the_cli_prints_history_and_inspect_as_of(journey, tmp_path, capsys):
    declaration, redrive_id, poisoned_version, _ = journey
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    before = table_versions(declaration)
    base = ["--config", str(config)]
    assert cli.main([*base, "history", "m-1", "--json"]) == cli.EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["message_id"] == "m-1" and [e["kind"] for e in out["events"]][-1] == "processed"
    assert {"at", "kind", "queue", "table", "cycle", "attempt", "outcome", "error_type", "error_message",
            "run_id", "action_id", "batch_id", "actor", "from_table", "inferred", "detail", "retry_delay_s",
            "cycle_seq"} == set(out["events"][0])
    assert cli.main([*base, "history", "m-1"]) == cli.EXIT_OK
    text = capsys.readouterr().out
    assert "redriven" in text and redrive_id in text and "DependencyDown" in text
    assert cli.main([*base, "history", "nobody"]) == cli.EXIT_INCOMPLETE
    assert "'nobody' is in no table" in capsys.readouterr().err
    assert cli.main([*base, "inspect", "m-1", "--as-of", str(poisoned_version), "--table", "poison"]) == cli.EXIT_OK
    assert "in q/poison" in capsys.readouterr().out
    assert cli.main([*base, "inspect", "m-1", "--as-of", "3"]) == cli.EXIT_USAGE
    assert "needs --table" in capsys.readouterr().err
    assert cli.main([*base, "inspect", "m-1", "--as-of", "yesterday"]) == cli.EXIT_USAGE
    # A table no message can be in is refused by name, not answered "in no table".
    assert cli.main([*base, "inspect", "m-1", "--table", "../../x"]) == cli.EXIT_USAGE
    assert "table '../../x' is not one the message can be in; choose one of" in capsys.readouterr().err
    assert table_versions(declaration) == before
