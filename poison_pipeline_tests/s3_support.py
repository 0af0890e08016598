"""The test run's S3-compatible server: moto's, on 127.0.0.1, started once and stopped by its
process id, with one bucket; each test takes a lake of its own under a fresh prefix."""

from __future__ import annotations

import contextlib
import itertools
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

BUCKET = "lake-bucket"
_prefixes = itertools.count()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def listening(command: list[str], port: int, what: str, stderr: Any = subprocess.DEVNULL) -> Iterator[None]:
    """Run a local server's `command` while the context is open, once it accepts connections on
    `port` (a minute at most); stopped by its process id (SIGTERM, then SIGKILL after 10 s)."""
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not start") from None
                time.sleep(0.1)
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def fresh_root(name: str = "lake") -> str:
    """A lake root in the bucket that no other test of this run uses."""
    return f"s3://{BUCKET}/{name}{next(_prefixes)}"


def serve(log: str | None = None, delay_ms: float = 0) -> Iterator[dict[str, str]]:
    """Run the server while the generator is open; yields the storage options that reach it: an
    endpoint and credentials only, as a user gives them (delta-rs 1.x commits with S3's conditional
    writes by default, which moto serves: concurrent commits are safe without another option).
    `log`: a file that gets the server's request log, one line per request. `delay_ms`: added to
    every request (poison_pipeline_tests/delayed_s3.py)."""
    import boto3

    port = free_port()
    errors = open(log, "a") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the server
    command = ([sys.executable, "-m", "poison_pipeline_tests.delayed_s3", str(port), str(delay_ms)] if delay_ms
               else [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
    try:
        with listening(command, port, "the moto S3 server", errors):
            endpoint = f"http://127.0.0.1:{port}"
            options = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
            client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                                  aws_secret_access_key="testing", region_name="us-east-1")
            client.create_bucket(Bucket=BUCKET)
            yield options
    finally:
        if log:
            errors.close()  # type: ignore[union-attr]
