"""A lake on Azure Blob storage (`az://`), on the test run's Azurite (`azure_server`, conftest):
delta-rs's commits there are safe from concurrent writers, the operator's sequence keeps every
message once, as on S3 (test_object_store.py), and a store that
cannot be reached (no such container, no route to the endpoint, a refused key) fails a command at
once with an error naming the container or endpoint and the option to check, never the key, and
writes nothing."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from poison_pipeline_tests import store_scenarios
from poison_pipeline_tests.azure_support import CONTAINER, KEY, fresh_root

pytestmark = pytest.mark.e2e
WRONG_KEY = "d3JvbmctYnV0LXNlY3JldC03ZjNh"  # base64, as an account key is


# `{endpoint}`: the AZURE_STORAGE_ENDPOINT the command was given.
@pytest.mark.parametrize("case, said", [
    ("no such container", "the bucket or container of lake_root does not exist on the store "
                          "(container 'missing-"),
    ("no route to the endpoint", f"the store cannot be reached (endpoint {{endpoint}}, container '{CONTAINER}'): "
                                 "check storage_options.AZURE_STORAGE_ENDPOINT"),
    ("a refused key", f"the store refused the credentials (endpoint {{endpoint}}, container '{CONTAINER}'): "
                      "check the credentials in storage_options (AZURE_STORAGE_ACCOUNT_NAME / "
                      "AZURE_STORAGE_ACCOUNT_KEY"),
], ids=["no such container", "no route to the endpoint", "a refused key"])
@pytest.mark.parametrize("command", ["enqueue", "status"])
def test_an_unreachable_azure_store_fails_naming_it_and_writes_nothing(
        azure_server: dict[str, str], tmp_path: Path, case: str, said: str, command: str) -> None:
    options = dict(azure_server)
    root = lake = fresh_root("unreachable")
    if case == "no such container":
        lake = root.replace(f"az://{CONTAINER}/", f"az://missing-{uuid.uuid4().hex[:12]}/")
    elif case == "no route to the endpoint":
        options["AZURE_STORAGE_ENDPOINT"] = "http://127.0.0.1:1/devstoreaccount1"
    else:
        options["AZURE_STORAGE_ACCOUNT_KEY"] = WRONG_KEY
    said = said.format(endpoint=options["AZURE_STORAGE_ENDPOINT"])
    store_scenarios.fails_naming_the_store(tmp_path, command, lake, options, said, secrets=[KEY, WRONG_KEY])
    # Nothing was written where the lake would be, on the reachable store.
    assert store_scenarios.written_under(root, azure_server) == []


def test_poison_a_redrive_its_undo_and_a_purge_on_an_azure_lake_keep_every_message_once(
        make_declaration, azure_server: dict[str, str]) -> None:
    """The operator's sequence of test_object_store.py, on a lake on Azurite."""
    store_scenarios.operator_sequence(make_declaration, fresh_root("operator"), azure_server)


def test_commits_to_an_azure_lake_from_one_snapshot_never_both_land(azure_server: dict[str, str]) -> None:
    """delta-rs commits to Azure with a put that fails if the log entry exists (what the lease's
    fence relies on): eight appends at once all land, each in a version of its own, and of two
    deletes of the same row from one snapshot, the second is refused."""
    root = fresh_root("commits")
    write_deltalake(root, pa.table({"a": [0, 1]}), storage_options=azure_server)
    failed: list[BaseException] = []

    def append(value: int) -> None:
        try:
            write_deltalake(root, pa.table({"a": [value]}), mode="append", storage_options=azure_server)
        except Exception as error:  # noqa: BLE001 - reported below
            failed.append(error)

    writers = [threading.Thread(target=append, args=(value,)) for value in range(10, 18)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    table = DeltaTable(root, storage_options=azure_server)
    assert failed == [] and table.version() == 8
    assert sorted(table.to_pyarrow_table()["a"].to_pylist()) == [0, 1, *range(10, 18)]
    first, second = (DeltaTable(root, storage_options=azure_server) for _ in range(2))
    first.delete("a = 1")
    with pytest.raises(CommitFailedError):
        second.delete("a = 1")
