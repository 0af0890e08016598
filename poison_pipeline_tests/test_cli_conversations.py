"""`poison-pipeline end-conversation`, run in-process on a YAML declaration and real Delta tables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline.cli import main
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests import conversation_hooks

HANDLER = "poison_pipeline_tests.handlers:scripted"
RECORD = "poison_pipeline_tests.conversation_hooks:record"
FLAKY = "poison_pipeline_tests.conversation_hooks:flaky"


@pytest.fixture(autouse=True)
def hook_calls() -> Iterator[list[dict[str, Any]]]:
    conversation_hooks.CALLS.clear()
    conversation_hooks.FAILURES_LEFT[0] = 0
    yield conversation_hooks.CALLS
    conversation_hooks.CALLS.clear()


def write_config(folder: Path, hook: str = RECORD) -> Path:
    path = folder / "poison_pipeline.yaml"
    queues = {"q": {"handler": HANDLER, "policy": {"max_retry_cycles": 1}, "on_conversation_end": hook},
              "other": {"handler": HANDLER, "policy": {"max_retry_cycles": 0}}}
    path.write_text(yaml.safe_dump({"lake_root": "lake", "queues": queues}, sort_keys=False))
    return path


def send(config: Path, queue: str, *messages: tuple[str, str | None, str | None]) -> None:
    records = [{"message_id": mid, "message_type": "t", "body": {}, "conversation_id": conv, "sender": sender}
               for mid, conv, sender in messages]
    records = [{k: v for k, v in r.items() if v is not None} for r in records]
    assert not enqueue(load_declaration(config), queue, records).refused


def inbound(config: Path, queue: str) -> list[str]:
    table = QueueTables.of(load_declaration(config), queue).open("inbound").to_pyarrow_table(columns=["message_id"])
    return sorted(table["message_id"].to_pylist())


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = write_config(tmp_path)
    send(path, "q", ("m-1", "c-1", "shop"), ("m-2", "c-1", "shop"), ("o-1", "c-2", "shop"))
    send(path, "other", ("x-1", "c-9", "depot"))
    return path


def end(config: Path, *args: str) -> list[str]:
    return ["--config", str(config), "end-conversation", *args]


def test_end_a_conversation_in_a_named_queue(config: Path, capsys, hook_calls) -> None:
    code = main(end(config, "c-1", "--code", "42", "--description", "part obsolete", "--queue", "q",
                    "--actor", "alice"))

    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines() == [
        "conversation 'c-1' in queue 'q': ended by alice with code 42 (application error): part obsolete",
        "  moved to dead_letter (reason conversation_ended): inbound 2, retry_1 0, poison 0 (2 in all)",
        "  notified: shop (conversation_error)",
        f"  clean-up hook {RECORD}: ran",
    ]
    assert inbound(config, "q") == ["o-1"]
    assert len(hook_calls) == 1


def test_running_it_again_reports_the_first_end_and_changes_nothing(config: Path, capsys, hook_calls) -> None:
    assert main(end(config, "c-1", "--code", "42", "--description", "part obsolete", "--actor", "alice")) == 0
    capsys.readouterr()

    assert main(end(config, "c-1", "--code", "-8489", "--description", "expired", "--actor", "bob")) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("conversation 'c-1' in queue 'q': already ended at ")
    assert out[0].endswith(" by alice with code 42 (application error): part obsolete; not recorded again")
    assert out[1] == ("  note: code -8489 and description 'expired' given now are not recorded; "
                      "the first end stands")
    assert out[2].endswith("inbound 0, retry_1 0, poison 0 (0 in all)")
    assert out[3] == "  notified: nobody new (no sender known, or all told before)"
    assert out[4] == f"  clean-up hook {RECORD}: already ran; not run again"
    assert len(hook_calls) == 1


def test_without_a_queue_it_ends_the_conversation_where_it_is(config: Path, capsys) -> None:
    assert main(end(config, "c-9", "--code", "-8462", "--description", "peer closed")) == 0

    out = capsys.readouterr().out
    assert "conversation 'c-9' in queue 'other': ended by " in out
    assert "with code -8462 (system error (recoverable)): peer closed" in out
    assert "inbound 1, poison 0 (1 in all)" in out
    assert "clean-up hook: none declared (on_conversation_end)" in out
    assert "queue 'q'" not in out
    assert inbound(config, "other") == []


def test_a_conversation_found_nowhere_exits_1(config: Path, capsys) -> None:
    assert main(end(config, "ghost", "--code", "1", "--description", "x")) == 1
    assert capsys.readouterr().err == (
        "poison-pipeline end-conversation: conversation 'ghost' has no messages, ledger rows or recorded end "
        "in queues q, other; name a queue with --queue to end it there anyway\n")


def test_a_named_queue_ends_it_even_with_no_messages(config: Path, capsys) -> None:
    assert main(end(config, "ghost", "--code", "1", "--description", "x", "--queue", "other")) == 0
    assert "(0 in all)" in capsys.readouterr().out
    # Now on record, it is found without --queue too.
    assert main(end(config, "ghost", "--code", "1", "--description", "x")) == 0
    assert "already ended" in capsys.readouterr().out


def test_a_failing_hook_exits_1_and_a_rerun_retries_it(tmp_path: Path, capsys, hook_calls) -> None:
    config = write_config(tmp_path, FLAKY)
    send(config, "q", ("m-1", "c-1", None))
    conversation_hooks.FAILURES_LEFT[0] = 1
    command = end(config, "c-1", "--code", "5", "--description", "bad")

    assert main(command) == 1
    out, err = capsys.readouterr()
    problem = "poison_pipeline_tests.conversation_hooks.StateStoreDown: cannot drop the state of c-1"
    assert f"  clean-up hook {FLAKY}: FAILED: {problem}" in out
    assert err == (f"poison-pipeline end-conversation: error: queue 'q': clean-up hook {FLAKY} failed: "
                   f"{problem}; the conversation is ended, run the command again to retry the hook\n")

    assert main(command) == 0
    assert f"  clean-up hook {FLAKY}: ran" in capsys.readouterr().out
    assert len(hook_calls) == 1


def test_json_output(config: Path, capsys) -> None:
    assert main(end(config, "c-1", "--code", "42", "--description", "gone", "--actor", "alice", "--json")) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["queue"] == "q" and result["already_ended"] is False
    assert result["removed"] == {"inbound": 2, "retry_1": 0, "poison": 0} and result["removed_total"] == 2
    assert (result["notified"], result["hook_ran"], result["kind"]) == (["shop"], True, "application error")


def test_status_shows_ended_conversations(config: Path, capsys) -> None:
    assert main(end(config, "c-1", "--code", "42", "--description", "gone")) == 0
    capsys.readouterr()
    assert main(["--config", str(config), "status", "--queue", "q"]) == 0
    assert "  conversations ended with an error: 1" in capsys.readouterr().out
    assert main(["--config", str(config), "status", "--json"]) == 0
    queues = {q["queue"]: q for q in json.loads(capsys.readouterr().out)["queues"]}
    assert (queues["q"]["ended_conversations"], queues["other"]["ended_conversations"]) == (1, 0)


@pytest.mark.parametrize(("args", "message"), [
    (["c-1", "--code", "0", "--description", "x"],
     "error: code 0: must be a non-zero integer (positive: application error, negative: system error)"),
    (["c-1", "--code", "1", "--description", ""], "error: description '': must be non-empty text"),
    (["c-1", "--code", "1", "--description", "x", "--queue", "nope"],
     "error: no queue 'nope' is declared; declared: q, other"),
    (["", "--code", "1", "--description", "x"], "error: conversation_id '': must be non-empty text"),
    (["c-1", "--code", "1", "--description", "x", "--actor", ""], "error: actor '': must be non-empty text"),
    (["c-1", "--code", "abc", "--description", "x"], "error: --code 'abc': input should be a valid integer"),
    (["c-1", "--description", "x"], "the following arguments are required: --code"),
])
def test_usage_errors_exit_2_and_change_nothing(config: Path, capsys, args: list[str], message: str) -> None:
    assert main(end(config, *args)) == 2
    assert message in capsys.readouterr().err
    assert inbound(config, "q") == ["m-1", "m-2", "o-1"]


def test_help_documents_every_option(capsys) -> None:
    assert main(["end-conversation", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("ID", "--code", "--description", "--queue", "--actor", "--json", "--config",
                   "conversation_ended", "conversation_error", "on_conversation_end", "exit codes"):
        assert option in out
    assert main(["--help"]) == 0
    assert "end-conversation" in capsys.readouterr().out
