"""A lake on an object store that cannot be reached (no such bucket, no route to the endpoint):
every command fails at once with an error naming the store and what to check, never the
credentials, and writes nothing. The store is the test run's S3 server (`s3_server`, conftest)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from poison_pipeline.storage.uri import fs_of
from poison_pipeline_tests.s3_support import BUCKET, fresh_root
from poison_pipeline_tests.test_fuzz_envelopes import run_cli

pytestmark = pytest.mark.e2e
SECRET = "wrong-but-secret-7f3a"
LINE = '{"message_id": "a", "message_type": "t", "body": {}}\n'


def _config(folder: Path, root: str, options: dict[str, str]) -> str:
    path = folder / "declaration.yaml"
    path.write_text(yaml.safe_dump({"lake_root": root, "storage_options": options,
                                    "queues": {"q": {"handler": "poison_pipeline_tests.handlers:accept"}}}))
    return str(path)


@pytest.mark.parametrize("case, said", [
    ("no such bucket", "the bucket or container of lake_root does not exist on the store (bucket 'missing-"),
    ("no route to the endpoint", "the store cannot be reached (endpoint http://127.0.0.1:1): check "
                                 "storage_options.AWS_ENDPOINT_URL"),
])
@pytest.mark.parametrize("command", ["enqueue", "status"])
def test_an_unreachable_store_fails_naming_it_and_writes_nothing(s3_server: dict[str, str], tmp_path: Path,
                                                                case: str, said: str, command: str) -> None:
    options = {**s3_server, "AWS_SECRET_ACCESS_KEY": SECRET}
    root = fresh_root("unreachable")
    if case == "no such bucket":
        root = root.replace(f"s3://{BUCKET}/", f"s3://missing-{tmp_path.name.lower()[-20:]}/")
    else:
        options["AWS_ENDPOINT_URL"] = "http://127.0.0.1:1"
    (tmp_path / "one.jsonl").write_text(LINE)
    argv = ["enqueue", "--queue", "q", str(tmp_path / "one.jsonl")] if command == "enqueue" else ["status"]
    code, out, err = run_cli([*argv, "--config", _config(tmp_path, root, options)])
    assert code == 1, (out, err)
    assert said in err
    assert SECRET not in out + err
    # Nothing was written where the lake would be, on the reachable store.
    fs, path = fs_of(fresh_root("probe").rsplit("/", 1)[0], s3_server)
    written = fs.get_file_info(pafs.FileSelector(f"{path}/{root.rsplit('/', 1)[1]}", recursive=True,
                                                 allow_not_found=True))
    assert written == []
