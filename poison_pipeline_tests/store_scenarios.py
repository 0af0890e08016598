"""What a lake on any object store the tests start must do (test_object_store.py runs it on the S3
server, test_azure_lake.py on Azurite): an operator's sequence keeps every message once, and a
store that cannot be reached fails a command at once, naming the store and what to check, never
a credential, and writing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import yaml

from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.purge import purge_table
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage.intake import accepted_total
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.uri import fs_of
from poison_pipeline_tests.support import places
from poison_pipeline_tests.test_fuzz_envelopes import run_cli

LINE = '{"message_id": "a", "message_type": "t", "body": {}}\n'


def operator_sequence(make_declaration: Any, root: str, options: dict[str, str]) -> None:
    """Poison, a redrive, its undo and a purge on a lake at `root` (small cycles, no Spark): each
    message is in one place after every step and the books balance."""
    declaration = make_declaration(
        {"q": {"handler": "poison_pipeline_tests.handlers:scripted",
               "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"}}},
        lake_root=root, storage_options=options, lease={"expiry": "4s"}, small_cycles={"max_messages": 1000})
    tables = QueueTables.of(declaration, "q")

    def balanced() -> None:
        assert all(len(where) == 1 for where in places(declaration).values()), places(declaration)
        assert conservation(tables).line(accepted_total(tables)).endswith("OK")

    def cycle() -> None:
        run_cycle(_no_spark, declaration, "q", "inbound")

    enqueue(declaration, "q", [{"message_id": m, "message_type": "t", "body": {"fail": m != "ok"}}
                               for m in ("ok", "p1", "p2")])
    cycle()
    assert places(declaration) == {"ok": ["processed:processed"], "p1": ["poison"], "p2": ["poison"]}
    balanced()
    redriven = redrive_table(declaration, "q", "poison", redrive_id="r1")
    assert redriven.moved == 2 and places(declaration)["p1"] == ["inbound"]
    balanced()
    assert undo_action(declaration, "r1").restored == 2
    assert places(declaration)["p1"] == ["poison"]
    balanced()
    assert purge_table(declaration, "q", "poison", older_than="0s", purge_id="x1").purged == 2
    assert set(places(declaration)) == {"ok"}
    balanced()


def fails_naming_the_store(folder: Path, command: str, root: str, options: dict[str, str], said: str,
                           secrets: list[str]) -> None:
    """`command` (enqueue or status) on a lake at `root`, reached with `options`, exits with code 1
    and `said` in its error, and repeats none of `secrets` (option values)."""
    (folder / "one.jsonl").write_text(LINE)
    config = folder / "declaration.yaml"
    config.write_text(yaml.safe_dump({"lake_root": root, "storage_options": options,
                                      "queues": {"q": {"handler": "poison_pipeline_tests.handlers:accept"}}}))
    argv = ["enqueue", "--queue", "q", str(folder / "one.jsonl")] if command == "enqueue" else ["status"]
    code, out, err = run_cli([*argv, "--config", str(config)])
    assert code == 1, (out, err)
    assert said in err, err
    assert [secret for secret in secrets if secret in out + err] == []


def written_under(root: str, options: dict[str, str]) -> list[pafs.FileInfo]:
    """Every file and folder under `root` on the store that `options` reach."""
    fs, path = fs_of(root, options)
    return fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))


def _no_spark() -> None:
    raise AssertionError("small cycles only: no Spark session may be started")
