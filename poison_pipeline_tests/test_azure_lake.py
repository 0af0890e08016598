"""A lake on Azure Blob storage (`az://`), on the test run's Azurite (`azure_server`, conftest):
the operator's sequence keeps every message once, as on S3 (test_object_store.py), and a store that
cannot be reached (no such container, no route to the endpoint, a refused key) fails a command at
once with an error naming the container or endpoint and the option to check, never the key, and
writes nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

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
