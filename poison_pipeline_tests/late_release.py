"""`python -m poison_pipeline_tests.late_release ARGS...`: the `poison-pipeline` command with
Arrow's late release of what it read made certain instead of occasional.

delta-rs's `to_pyarrow_dataset` reads files through Python objects; Arrow drops the buffers they
returned on its own worker threads, sometimes just after the read has returned, and the process
aborts (134) if Python is finalizing by then. Here every such buffer is a `bytes` subclass whose
release on an Arrow thread sleeps a little with the GIL released: the main thread gets ahead of
that worker every time, as it does now and then on a busy machine.

Runs the installed `poison-pipeline` entry point; with `--finalize` first, `sys.exit(main(...))`
instead, the plain Python exit the entry point must not depend on.
"""

from __future__ import annotations

import sys
import threading
import time
from importlib.metadata import entry_points
from typing import Any

import pyarrow as pa
from deltalake.fs import DeltaStorageHandler

DELAY = 0.05


class _LateBytes(bytes):
    def __del__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(DELAY)


class _File:
    """delta-rs's file object, its reads returned as `_LateBytes`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, *args: Any) -> bytes:
        return _LateBytes(self._inner.read(*args))

    def read_at(self, *args: Any) -> bytes:
        return _LateBytes(self._inner.read_at(*args))


def _open_input_file(self: DeltaStorageHandler, path: str) -> pa.PythonFile:
    return pa.PythonFile(_File(self._handler.open_input_file(path)), mode="r")


def install() -> None:
    DeltaStorageHandler.open_input_file = _open_input_file  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    if sys.argv[1:2] == ["--finalize"]:
        from poison_pipeline.cli import main

        sys.exit(main(sys.argv[2:]))
    (entry,) = entry_points(group="console_scripts", name="poison-pipeline")
    sys.argv = ["poison-pipeline", *sys.argv[1:]]
    sys.exit(entry.load()())
