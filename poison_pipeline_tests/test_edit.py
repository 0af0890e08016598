"""Edit and retry (issue 8 item 4): a failed message's body is replaced, the original kept in the
`edits` table, and that one message redriven; bad input changes no table; killed at each durable
step and run again, the edit completes once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from poison_pipeline import cli
from poison_pipeline.operations import edit as edit_module
from poison_pipeline.operations.actions import DONE, PLANNED, Recorded, find_action
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import EditError, EditNotFound, EditRequest, edit_message, edits_of
from poison_pipeline.operations.inspect_message import inspect_message
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Committer, QueueWriter
from poison_pipeline_tests.support import places, rows, table_versions

RECORDING = "poison_pipeline_tests.recording_handlers:recording"
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 0, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "outage_threshold": 0, "max_body_bytes": 200}


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


@pytest.fixture
def lake(spark, make_declaration, tmp_path: Path):
    """Queue q with two messages in poison whose bodies make the handler fail."""
    declaration = make_declaration({"q": {"handler": RECORDING, "policy": POLICY}})
    log = tmp_path / "calls.jsonl"
    records = [{"message_id": f"bad-{i}", "message_type": "refund", "body": {"fail": True, "log": str(log)},
                "headers": {"tenant": "acme"}} for i in range(2)]
    assert not enqueue(declaration, "q", records).refused
    run_cycle(spark, declaration, "q", "inbound")
    assert sorted(places(declaration)) == ["bad-0", "bad-1"]
    return declaration, log


def fixed(log: Path) -> bytes:
    return json.dumps({"log": str(log)}).encode()


def test_an_edited_body_is_processed_and_the_original_stays_readable(spark, lake):
    declaration, log = lake
    original = rows(declaration, "poison")[0]["body"]
    result = edit_message(declaration, "bad-0", fixed(log), {"fixed-by": "alice"}, actor="alice")
    assert (result.queue, result.source, result.moved, result.actor) == ("q", "poison", 1, "alice")
    assert result.original_body == original and result.new_headers == {"tenant": "acme", "fixed-by": "alice"}
    waiting = {r["message_id"]: r for r in rows(declaration, "inbound")}
    assert waiting["bad-0"]["body"] == fixed(log) and dict(waiting["bad-0"]["headers"])["fixed-by"] == "alice"
    assert places(declaration)["bad-1"] == ["poison"]
    action = find_action(QueueTables.of(declaration, "q"), result.edit_id)
    assert action.kind == "edit" and action.state == DONE and action.actor == "alice"
    assert run_cycle(spark, declaration, "q", "inbound").counts["processed"] == 1
    assert places(declaration)["bad-0"] == ["processed:processed"]
    (kept,) = edits_of(declaration, "bad-0")
    assert (kept["original_body"], kept["new_body"], kept["actor"]) == (original, fixed(log), "alice")
    seen = inspect_message(declaration, "bad-0")
    assert [e.original_body for e in seen.edits] == [original]
    # The same edit again changes nothing.
    before = table_versions(declaration)
    assert edit_message(declaration, "bad-0", fixed(log), {"fixed-by": "alice"}, edit_id=result.edit_id).already_done
    assert table_versions(declaration) == before


@pytest.mark.parametrize("body, problem", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not valid UTF-8"),
    (b'{"pad": "' + b"x" * 300 + b'"}', "over the queue's limit of 200"),
])
def test_an_invalid_body_is_refused_and_no_table_changes(lake, body, problem):
    declaration, _ = lake
    before = table_versions(declaration)
    with pytest.raises(EditError, match=problem):
        edit_message(declaration, "bad-0", body)
    assert table_versions(declaration) == before


def test_an_unknown_message_and_a_bad_header_are_refused(lake):
    declaration, log = lake
    before = table_versions(declaration)
    with pytest.raises(EditNotFound, match="'nobody' is not in"):
        edit_message(declaration, "nobody", fixed(log))
    with pytest.raises(ValidationError, match="headers\n  Value error, '': a header name cannot be empty"):
        EditRequest(message_id="bad-0", body="{}", headers={"": "x"})
    assert table_versions(declaration) == before


STEPS = ["begin", "record", "plan", "append", "remove", "redrive_done", "finish"]


@pytest.mark.parametrize("step", STEPS)
def test_killed_at_each_step_and_run_again_it_completes_once(lake, monkeypatch, step):
    declaration, log = lake
    # Where the kill falls, and (for a record's step) which action's record it is.
    targets = {"begin": (Recorded, "begin", "edit"), "record": (edit_module, "_record", None),
               "plan": (Recorded, "record_plan", "redrive"), "append": (Committer, "append", None),
               "remove": (QueueWriter, "replace_batches", None), "redrive_done": (Recorded, "finish", "redrive"),
               "finish": (Recorded, "finish", "edit")}
    owner, name, kind = targets[step]
    original = getattr(owner, name)

    def die(*args: Any, **kwargs: Any) -> Any:
        ledgers_own = name == "append" and args[1] != "inbound"  # the ledgers' own appends go through
        if not ledgers_own and (kind is None or args[0].kind == kind):
            raise Crash(step)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, die)
    with pytest.raises(Crash):
        edit_message(declaration, "bad-0", fixed(log), edit_id="e1")
    monkeypatch.setattr(owner, name, original)
    if step != "begin":
        tables = QueueTables.of(declaration, "q")
        assert find_action(tables, "e1").state == PLANNED
    result = edit_message(declaration, "bad-0", fixed(log), edit_id="e1")
    assert not result.already_done
    assert places(declaration) == {"bad-0": ["inbound"], "bad-1": ["poison"]}
    (waiting,) = rows(declaration, "inbound")
    assert waiting["body"] == fixed(log)
    assert [r["new_body"] for r in edits_of(declaration, "bad-0")] == [fixed(log)]
    assert edit_message(declaration, "bad-0", fixed(log), edit_id="e1").already_done


def test_the_cli_edits_with_json_and_refuses_bad_input(lake, tmp_path, capsys):
    declaration, log = lake
    config = tmp_path / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    body = tmp_path / "body.json"
    body.write_bytes(b"{oops")
    run = ["--config", str(config), "edit"]
    before = table_versions(declaration)
    assert cli.main([*run, "bad-0", "--body-file", str(body)]) == cli.EXIT_USAGE
    assert "not valid JSON" in capsys.readouterr().err
    assert cli.main([*run, "bad-0", "--body-file", str(body), "--header", "novalue"]) == cli.EXIT_USAGE
    assert "--header 'novalue': write it as KEY=VALUE" in capsys.readouterr().err
    assert cli.main([*run, "bad-0", "--body-file", str(tmp_path / "missing")]) == cli.EXIT_USAGE
    assert "no such file" in capsys.readouterr().err
    body.write_bytes(fixed(log))
    assert cli.main([*run, "nobody", "--body-file", str(body)]) == cli.EXIT_INCOMPLETE
    assert "'nobody' is not in" in capsys.readouterr().err
    assert table_versions(declaration) == before
    assert cli.main([*run, "bad-1", "--body-file", str(body), "--header", "k=v=w", "--json"]) == cli.EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["message_id"] == "bad-1" and out["moved"] == 1 and out["new_headers"]["k"] == "v=w"
