"""No body is ever unpickled or evaluated. Bodies whose unpickling (`__reduce__` calling `open(path,
"w")`) or evaluation (Python, shell, YAML tags) would leave a file go through enqueue, an inbound and a
poison cycle whose handler reads them with `json()` and `text()` and fails, `status`, `groups`,
`inspect`, `history`, `edit`, `redrive` and the failure tables' Dagster metadata: no file appears,
and the commands show the bodies as data."""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline.defs.failure_metadata import table_metadata
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline_tests.fuzz_support import CODE_TEXTS, COUNTS, pickle_bytes
from poison_pipeline_tests.support import places, rows
from poison_pipeline_tests.test_fuzz_cli import no_spark
from poison_pipeline_tests.test_fuzz_envelopes import run_cli

HANDLER = "poison_pipeline_tests.handlers:reads_and_fails"


def hostile(folder: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """Envelopes of every hostile kind, each with a sentinel file of its own that only running its
    body would create."""
    records: list[dict[str, Any]] = []
    sentinels: list[Path] = []

    def sentinel() -> str:
        path = folder / f"sentinel-{len(sentinels)}"
        sentinels.append(path)
        return str(path)

    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        records.append({"message_type": "pickle", "encoding": "binary",
                        "body_base64": base64.b64encode(pickle_bytes(sentinel(), protocol)).decode()})
    # Protocol 0 is ASCII: a pickle that passes as a text body.
    records.append({"message_type": "pickle", "encoding": "text", "body": pickle_bytes(sentinel(), 0).decode()})
    for code in CODE_TEXTS:
        records.append({"message_type": "code", "encoding": "text", "body": code.format(path=sentinel())})
        records.append({"message_type": "code", "body": {"run": code.format(path=sentinel()), "n": 1}})
        records.append({"message_type": "code", "encoding": "json", "body": json.dumps(code.format(path=sentinel()))})
        escaped = code.format(path=sentinel()).replace("&", "&amp;").replace("<", "&lt;")
        records.append({"message_type": "code", "encoding": "xml", "body": f"<cmd>{escaped}</cmd>",
                        "headers": {"x-run": code.format(path=sentinel())},
                        "sender": code.format(path=sentinel())[:250]})
    for n, record in enumerate(records):
        record["message_id"] = f"hostile-{n}"
    records.append({"message_id": f"__import__('os').system('touch {sentinel()}')", "message_type": "code",
                    "body": {"a": 1}})
    return records, sentinels


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The hostile bodies enqueued by the command, through an inbound cycle (to poison) and a poison
    cycle (to quarantine)."""
    folder = tmp_path_factory.mktemp("never_evaluated")
    config = folder / "poison_pipeline.yaml"
    policy = {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"}
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": {"handler": HANDLER, "policy": policy}}}))
    records, sentinels = hostile(folder)
    source = folder / "hostile.jsonl"
    source.write_text("".join(json.dumps(record) + "\n" for record in records))
    code, out, err = run_cli(["--config", str(config), "enqueue", str(source), "--queue", "q"])
    assert code == 0, err
    declaration = load_declaration(config)
    assert run_cycle(no_spark, declaration, "q", "inbound").counts["poisoned"] == len(records)
    run_cycle(no_spark, declaration, "q", "poison")
    COUNTS["hostile bodies"] += len(records)
    return {"config": str(config), "declaration": declaration, "records": records, "sentinels": sentinels,
            "folder": folder}


def _no_sentinel(pipeline: dict[str, Any]) -> None:
    made = [path for path in pipeline["sentinels"] if path.exists()]
    assert not made, f"a body was run: {made}"


def test_the_cycles_fail_every_hostile_message_without_running_its_body(pipeline) -> None:
    where = places(pipeline["declaration"])
    assert {tuple(tables) for tables in where.values()} == {("quarantine",)}
    assert len(where) == len(pipeline["records"])
    _no_sentinel(pipeline)


def test_operator_commands_show_the_bodies_as_data_and_run_none(pipeline) -> None:
    config, records = pipeline["config"], pipeline["records"]
    outputs = []
    for argv in (["status"], ["status", "--json"], ["groups"], ["groups", "--json"], ["actions", "--json"]):
        code, out, err = run_cli(["--config", config, *argv])
        assert code == 0, (argv, err)
        outputs.append(out)
    for n, record in enumerate(records):
        shows = [["inspect", record["message_id"], "--stack"], ["inspect", record["message_id"], "--json"]]
        for argv in shows + ([["history", record["message_id"], "--json"]] if n % 4 == 0 else []):
            code, out, err = run_cli(["--config", config, *argv])
            assert code == 0 and "Traceback" not in err, (argv, err)
            outputs.append(out)
    shown = "\n".join(outputs)
    assert "__import__(" in shown and "!!python/object/apply" in shown  # the text bodies, as text
    for name in ("poison", "quarantine"):  # what the Dagster materializations of the failure tables carry
        assert table_metadata(pipeline["declaration"], "q", name)
    _no_sentinel(pipeline)


def test_edit_and_redrive_move_hostile_bodies_without_running_them(pipeline) -> None:
    config, folder = pipeline["config"], pipeline["folder"]
    body = folder / "new-body"
    body.write_bytes(pickle_bytes(str(folder / "sentinel-edit"), pickle.HIGHEST_PROTOCOL))
    pipeline["sentinels"].append(folder / "sentinel-edit")
    code, out, err = run_cli(["--config", config, "edit", "hostile-0", "--body-file", str(body), "--json"])
    assert code == 0, err
    code, out, err = run_cli(["--config", config, "redrive", "q", "--from", "quarantine", "--dry-run", "--json"])
    assert code == 0 and json.loads(out)["selected"] == len(pipeline["records"]) - 1, err
    code, out, err = run_cli(["--config", config, "redrive", "q", "--from", "quarantine", "--json"])
    assert code == 0 and json.loads(out)["moved"] == len(pipeline["records"]) - 1, err
    declaration = pipeline["declaration"]
    assert run_cycle(no_spark, declaration, "q", "inbound").counts["poisoned"] == len(pipeline["records"])
    edited = [row for row in rows(declaration, "poison") if row["message_id"] == "hostile-0"]
    assert edited[0]["body"] == body.read_bytes()  # stored as the bytes it is
    _no_sentinel(pipeline)
