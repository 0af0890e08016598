"""The `poison-pipeline` command line, run in-process on a YAML declaration and real Delta tables."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from poison_pipeline.cli import main
from poison_pipeline.domain.declaration import CONFIG_ENV, load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.enqueue import reasons_path, refused_path
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline_tests.support import table_versions

HANDLER = "poison_pipeline_tests.handlers:scripted"
QUEUES: dict[str, Any] = {
    "q": {"handler": HANDLER, "policy": {"receive_retry_count": 1, "max_retry_cycles": 0,
                                         "retry_cycle_delay": 0, "receive_error_handling": "reject"}},
    "other": {"handler": HANDLER},
}


def write_config(folder: Path, queues: dict[str, Any] | None = None, **extra: Any) -> Path:
    # A relative lake root: the declaration resolves it against the file's folder.
    path = folder / "poison_pipeline.yaml"
    data = {"lake_root": "lake", "queues": queues or QUEUES, **extra}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_jsonl(path: Path, *lines: str | dict[str, Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def inbound_ids(config: Path, queue: str = "q") -> list[str]:
    tables = QueueTables.of(load_declaration(config), queue)
    return sorted(tables.open("inbound").to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist())


@pytest.fixture(scope="module")
def cycled(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A declaration file whose queue q went through one inbound cycle: ok-1 processed, bad-1 and
    bin-1 rejected to dead-letter after two attempts each."""
    folder = tmp_path_factory.mktemp("cli")
    config = write_config(folder)
    messages = write_jsonl(
        folder / "in.jsonl",
        {"message_id": "ok-1", "message_type": "order", "body": {"n": 1}},
        {"message_id": "bad-1", "message_type": "order", "body": {"fail": True}},
        {"message_id": "bin-1", "message_type": "blob", "encoding": "binary",
         "body_base64": base64.b64encode(b"\xde\xad\xbe\xef").decode()},
    )
    assert main(["--config", str(config), "enqueue", str(messages), "--queue", "q"]) == 0
    report = run_cycle(spark, load_declaration(config), "q", "inbound")
    assert (report.counts["processed"], report.counts["rejected"]) == (1, 2)
    return config


def test_enqueue_refuses_a_malformed_line_and_enqueues_the_rest(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    bad = ('{"message_id": "m-bad", "message_type": "t", "body": {}, "sequence_number": "x", '
           '"conversation_id": "c"}')
    source = write_jsonl(
        tmp_path / "batch.jsonl",
        {"message_id": "m-1", "message_type": "t", "body": {"a": 1}},
        "",
        bad,
        {"message_id": "m-2", "message_type": "t", "body": {"a": 2}},
    )

    code = main(["--config", str(config), "enqueue", str(source), "--queue", "q"])

    out, err = capsys.readouterr()
    assert code == 1
    assert "enqueued 2 of 3 messages into queue 'q'" in out
    # The blank line counts: the refused one is line 3 of the file, as an editor shows it.
    assert f"{source}: line 3: message_id 'm-bad': sequence_number: 'x' must be an integer" in err
    assert inbound_ids(config) == ["m-1", "m-2"]
    refused = tmp_path / "batch.refused.jsonl"
    assert refused_path(source) == refused
    assert refused.read_text() == bad + "\n"
    assert str(refused) in out
    # Why, line for line, beside the lines to fix.
    reasons = tmp_path / "batch.refused.reasons.jsonl"
    assert [json.loads(line) for line in reasons.read_text().splitlines()] == [
        {"line": 3, "refused_line": 1, "message_id": "m-bad", "reason": "sequence_number: 'x' must be an integer"}]
    assert str(reasons) in out


def test_enqueue_refuses_lines_that_would_break_the_whole_batch(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(
        b'{"message_id": "good", "message_type": "t", "body": {}}\n'
        b'{"message_id": "latin1", "message_type": "t", "encoding": "text", "body": "caf\xe9"}\n'
        b'{"message_id": "lone\\ud800", "message_type": "t", "body": {}}\n'
        b"not json at all\n"
    )

    code = main(["--config", str(config), "enqueue", str(source), "--queue", "q"])

    out, err = capsys.readouterr()
    assert code == 1
    assert "enqueued 1 of 4" in out
    assert "line 2: not valid UTF-8 at byte" in err
    assert ("line 3: message_id 'lone\\ud800': message_id: has a lone surrogate ('\\ud800' at character 4), "
            "which is not Unicode text and cannot be stored") in err
    assert "line 4: not valid JSON" in err
    assert inbound_ids(config) == ["good"]
    # The refused lines are kept byte for byte, invalid UTF-8 included.
    assert refused_path(source).read_bytes() == b"".join(source.read_bytes().split(b"\n", 1)[1:])
    reasons = [json.loads(line) for line in reasons_path(refused_path(source)).read_text().splitlines()]
    assert [(r["line"], r["refused_line"], r["message_id"]) for r in reasons] == [
        (2, 1, None), (3, 2, "lone\ud800"), (4, 3, None)]
    assert reasons[2]["reason"].startswith("not valid JSON")


def test_enqueue_all_valid_exits_0_and_writes_no_refused_file(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    source = write_jsonl(tmp_path / "ok.jsonl", {"message_id": "a", "message_type": "t", "body": {}})
    assert main(["--config", str(config), "enqueue", str(source), "-q", "q"]) == 0
    assert "enqueued 1 of 1" in capsys.readouterr().out
    assert not refused_path(source).exists()


def test_enqueue_missing_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    code = main(["--config", str(config), "enqueue", str(tmp_path / "nope.jsonl"), "--queue", "q"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"poison-pipeline enqueue: error: {tmp_path / 'nope.jsonl'}: no such file\n"


def test_enqueue_into_an_unknown_queue_lists_the_declared_ones(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    source = write_jsonl(tmp_path / "ok.jsonl", {"message_id": "a", "message_type": "t", "body": {}})
    code = main(["--config", str(config), "enqueue", str(source), "--queue", "nope"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "poison-pipeline enqueue: error: no queue 'nope' is declared; declared: q, other\n"


def test_status_after_a_cycle(cycled: Path, capsys) -> None:
    assert main(["--config", str(cycled), "status", "--queue", "q"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("q: ENABLED\n")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert rows["inbound"][1:2] == ["0"]
    assert rows["dead_letter"][1] == "2"
    assert rows["dead_letter"][-1] == "rejected=2"
    assert rows["processed"][1] == "1"
    assert rows["attempts"][1] == "5"  # ok-1 once, bad-1 and bin-1 twice each


def test_status_json_covers_every_queue(cycled: Path, capsys) -> None:
    assert main(["--config", str(cycled), "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    queues = {q["queue"]: q for q in data["queues"]}
    assert set(queues) == {"q", "other"}
    tables = {t["table"]: t for t in queues["q"]["tables"]}
    assert (tables["dead_letter"]["rows"], tables["dead_letter"]["by"]) == (2, {"rejected": 2})
    assert tables["inbound"]["due"] == 0
    assert queues["q"]["enabled"] is True
    assert not any(t["exists"] for t in queues["other"]["tables"])


def test_status_of_an_unknown_queue(cycled: Path, capsys) -> None:
    assert main(["--config", str(cycled), "status", "--queue", "orders"]) == 2
    assert capsys.readouterr().err == (
        "poison-pipeline status: error: no queue 'orders' is declared; declared: q, other\n")


def test_inspect_shows_body_and_history_and_changes_nothing(cycled: Path, capsys) -> None:
    declaration = load_declaration(cycled)
    before = table_versions(declaration)

    assert main(["--config", str(cycled), "inspect", "bad-1"]) == 0

    out = capsys.readouterr().out
    assert table_versions(declaration) == before
    assert "in q/dead_letter: dead-lettered (rejected)" in out
    assert "abort_count 2, total_abort_count 2, move_count 0" in out
    assert '"fail": true' in out
    assert "q/inbound cycle 0 attempt 1  abort" in out
    assert "q/inbound cycle 0 attempt 2  abort" in out
    assert "ValueError: message bad-1 always fails  [signature " in out
    assert "Traceback" not in out


def test_inspect_with_stack_and_json(cycled: Path, capsys) -> None:
    assert main(["--config", str(cycled), "inspect", "bad-1", "--stack"]) == 0
    assert "Traceback (most recent call last)" in capsys.readouterr().out
    assert main(["--config", str(cycled), "inspect", "bad-1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(a["table"], a["attempt"], a["outcome"]) for a in data["attempts"]] == [
        ("inbound", 1, "abort"), ("inbound", 2, "abort")]
    assert base64.b64decode(data["envelope"]["raw_body"]) == b'{"fail":true}'


def test_inspect_binary_body_shows_hex(cycled: Path, capsys) -> None:
    assert main(["--config", str(cycled), "inspect", "bin-1"]) == 0
    out = capsys.readouterr().out
    assert "body (4 bytes, shown as hex):" in out
    assert "00000000  de ad be ef" in out


def test_inspect_unknown_message_exits_1(cycled: Path, capsys) -> None:
    assert main(["--config", str(cycled), "inspect", "ghost"]) == 1
    assert capsys.readouterr().err == (
        "poison-pipeline inspect: message 'ghost' is in no table of queues q, other\n")


def test_enable_a_disabled_queue_then_again(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    tables = QueueTables.of(load_declaration(config), "q")
    set_enabled(tables, False, "poison_pipeline", "message m faulted")
    assert main(["--config", str(config), "status", "-q", "q"]) == 0
    assert "q: DISABLED since" in capsys.readouterr().out

    enable = ["--config", str(config), "enable", "q"]
    assert main([*enable, "--reason", "fixed the schema", "--actor", "alice"]) == 0
    out = capsys.readouterr().out
    assert "queue 'q' enabled by alice: fixed the schema" in out
    assert "by poison_pipeline: message m faulted" in out
    state = queue_state(tables)
    assert (state.enabled, state.actor, state.reason) == (True, "alice", "fixed the schema")

    assert main([*enable, "--actor", "bob"]) == 0
    assert "already enabled; its state is unchanged (action enable-" in capsys.readouterr().out
    assert tables.open(EVENTS).to_pyarrow_table().num_rows == 2
    assert queue_state(tables).actor == "alice"


def test_enable_an_unknown_queue(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    assert main(["--config", str(config), "enable", "nope"]) == 2
    assert "no queue 'nope' is declared; declared: q, other" in capsys.readouterr().err


def test_invalid_declaration_names_field_value_and_rule(tmp_path: Path, capsys) -> None:
    bad = {"q": {"handler": HANDLER, "policy": {"receive_retry_count": -1}}}
    config = write_config(tmp_path, bad)
    assert main(["--config", str(config), "status"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"poison-pipeline status: error: invalid declaration {config}:")
    assert "queues.q.policy.receive_retry_count = -1: Input should be greater than or equal to 0" in err
    assert "Traceback" not in err


def test_missing_or_unparsable_declaration_is_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["--config", str(tmp_path / "absent.yaml"), "status"]) == 2
    assert "does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("queues: [unclosed\n")
    assert main(["--config", str(broken), "status"]) == 2
    assert "is not valid YAML" in capsys.readouterr().err


def test_config_comes_from_the_environment_or_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    config = write_config(tmp_path)
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.chdir("/")
    assert main(["status", "--queue", "other"]) == 0
    assert capsys.readouterr().out.startswith("other: ENABLED")
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--queue", "q"]) == 0
    assert capsys.readouterr().out.startswith("q: ENABLED")


def test_config_may_follow_the_command(tmp_path: Path, capsys) -> None:
    config = write_config(tmp_path)
    assert main(["status", "--config", str(config), "--json"]) == 0
    assert {q["queue"] for q in json.loads(capsys.readouterr().out)["queues"]} == {"q", "other"}


@pytest.mark.parametrize(("command", "options"), [
    ([], ["--config", "enqueue", "status", "inspect", "enable", "exit codes"]),
    (["enqueue"], ["FILE.jsonl", "--queue", "--config", "refused"]),
    (["status"], ["--queue", "--json", "--config"]),
    (["inspect"], ["MESSAGE_ID", "--json", "--stack", "--config"]),
    (["enable"], ["QUEUE", "--reason", "--actor", "--config"]),
])
def test_help_documents_every_option(command: list[str], options: list[str], capsys) -> None:
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    for option in options:
        assert option in out


def test_usage_errors_exit_2(capsys) -> None:
    assert main([]) == 2
    assert "required: COMMAND" in capsys.readouterr().err
    assert main(["enqueue", "x.jsonl"]) == 2
    assert "--queue" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_refused_path_sits_beside_the_input() -> None:
    assert refused_path(Path("/d/orders.jsonl")) == Path("/d/orders.refused.jsonl")
    assert refused_path(Path("/d/orders.refused.jsonl")) == Path("/d/orders.refused.refused.jsonl")
    assert refused_path(Path("/d/orders.txt")) == Path("/d/orders.txt.refused.jsonl")

