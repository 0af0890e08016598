"""The test run's Azure Storage emulator: Azurite's blob service (`make azurite` installs it, and
the Node.js it runs on, in tools/azurite), on 127.0.0.1 with its data in a temporary folder,
started once and stopped by its process id, with one container; each test takes a lake of its own
under a fresh prefix."""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import itertools
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from poison_pipeline_tests.s3_support import free_port, listening

ACCOUNT = "devstoreaccount1"
# Azurite's development account key: published, the same in every copy of the emulator.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "lake-container"
MODULES = Path(__file__).resolve().parents[1] / "tools" / "azurite" / "node_modules"
_prefixes = itertools.count()


def fresh_root(name: str = "lake") -> str:
    """A lake root in the container that no other test of this run uses."""
    return f"az://{CONTAINER}/{name}{next(_prefixes)}"


def options_for(endpoint: str) -> dict[str, str]:
    """The storage options that reach the emulator's account at `endpoint`, as a user gives them
    for a store of their own: account, key, endpoint, and allow-http for its http:// endpoint."""
    return {"AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": KEY,
            "AZURE_STORAGE_ENDPOINT": f"{endpoint}/{ACCOUNT}", "AZURE_ALLOW_HTTP": "true"}


def serve(folder: Path) -> Iterator[dict[str, str]]:
    """Run Azurite's blob service with its data in `folder` while the generator is open; yields the
    storage options that reach it (delta-rs 1.x commits to Azure with a put that fails if the log
    entry exists, which Azurite serves: concurrent commits are safe without another option)."""
    node, main = MODULES / ".bin" / "node", MODULES / "azurite" / "dist" / "src" / "blob" / "main.js"
    assert node.exists() and main.exists(), f"Azurite is not installed in {MODULES.parent}: run `make azurite`"
    port = free_port()
    command = [str(node), str(main), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(folder),
               "--loose", "--skipApiVersionCheck", "--disableTelemetry", "--silent"]
    with listening(command, port, "Azurite"):
        endpoint = f"http://127.0.0.1:{port}"
        create_container(endpoint, CONTAINER)
        yield options_for(endpoint)


def create_container(endpoint: str, name: str) -> None:
    """Create a container with Blob storage's REST call, signed with the account key (Shared Key)."""
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-12-02"}
    signed = "".join(f"{key}:{value}\n" for key, value in sorted(headers.items()))
    # The verb, eleven standard headers (all empty: no body), the x-ms- headers, the resource.
    to_sign = f"PUT\n{chr(10) * 11}{signed}/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container"
    signature = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    request = urllib.request.Request(f"{endpoint}/{ACCOUNT}/{name}?restype=container", method="PUT",
                                     headers={**headers, "Authorization": f"SharedKey {ACCOUNT}:{signature}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 201, answer.status
