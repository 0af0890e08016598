"""`poison-pipeline status` shows what was purged for good, per table it was purged from, beside the
tables a message can still be in (issue 8: purged is a terminal outcome of its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from poison_pipeline.cli import main
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.test_cli import HANDLER, write_config, write_jsonl

MOVE = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0, "receive_error_handling": "move",
        "outage_threshold": 0}


@pytest.fixture(scope="module")
def failed(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Queue q with q-1 and q-2 in quarantine (poisoned, then stored by the poison reader), p-1 in
    poison and ok-1 processed; queue other declared but never used."""
    folder = tmp_path_factory.mktemp("cli_status")
    config = write_config(folder, {"q": {"handler": HANDLER, "policy": MOVE}, "other": {"handler": HANDLER}})
    declaration = load_declaration(config)
    cli = ["--config", str(config)]
    write_jsonl(folder / "a.jsonl", *({"message_id": f"q-{n}", "message_type": "order", "body": {"fail": True}}
                                      for n in (1, 2)), {"message_id": "ok-1", "message_type": "order", "body": {}})
    assert main([*cli, "enqueue", str(folder / "a.jsonl"), "--queue", "q"]) == 0
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "poison")
    write_jsonl(folder / "b.jsonl", {"message_id": "p-1", "message_type": "refund", "body": {"fail": True}})
    assert main([*cli, "enqueue", str(folder / "b.jsonl"), "--queue", "q"]) == 0
    run_cycle(spark, declaration, "q", "inbound")
    return config


def _status_json(config: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    assert main(["--config", str(config), "status", "--json"]) == 0
    return {q["queue"]: q for q in json.loads(capsys.readouterr().out)["queues"]}


def _rows(text: str) -> dict[str, list[str]]:
    """The human table's rows by table name (the queue's state line, the header and its rule skipped)."""
    return {line.split()[0]: line.split() for line in text.splitlines()[3:] if line.strip()}


def test_status_shows_purged_messages_per_source_table(failed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = ["--config", str(failed)]
    before = _status_json(failed, capsys)["q"]
    assert (before["purged"]["rows"], before["purged"]["by"]) == (0, {})

    assert main([*cli, "purge", "q", "--table", "quarantine", "--older-than", "1ms", "--yes", "--actor", "t"]) == 0
    assert main([*cli, "purge", "q", "--table", "poison", "--older-than", "1ms", "--yes", "--actor", "t"]) == 0
    capsys.readouterr()

    queues = _status_json(failed, capsys)
    purged = queues["q"]["purged"]
    assert (purged["table"], purged["kind"], purged["exists"]) == ("purged", "ledger", True)
    assert (purged["rows"], purged["by"]) == (3, {"poison": 1, "quarantine": 2})
    assert purged["oldest"] is not None and purged["oldest_age_s"] >= 0
    # The tables a message can still be in are listed as before; purged is a key of its own.
    assert [t["table"] for t in queues["q"]["tables"]] == [
        "inbound", "poison", "dead_letter", "quarantine", "processed", "attempts"]
    assert {t["table"]: t["rows"] for t in queues["q"]["tables"]}["quarantine"] == 0
    assert conservation(QueueTables.of(load_declaration(failed), "q")).purged == purged["rows"]
    assert queues["other"]["purged"]["exists"] is False

    assert main([*cli, "status", "--queue", "q"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["purged"][1] == "3"
    assert rows["purged"][-2:] == ["poison=1", "quarantine=2"]
    assert rows["quarantine"][1] == "0"


def test_status_of_a_queue_never_used_shows_no_purged_table(failed: Path, capsys) -> None:
    assert main(["--config", str(failed), "status", "--queue", "other"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("other: ENABLED\n")
    assert " ".join(_rows(out)["purged"][1:]) == "- (not created yet)"
