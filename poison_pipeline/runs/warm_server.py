"""The warm run worker: a process that has imported Dagster and loaded the code location once, and
forks one process per run, which runs it as `dagster api execute_run` does.

A run's process otherwise pays for a Python start, `import dagster` and loading the code location
(about 4 s on 2 cores) before the run begins. Forking a process that has done all that costs
milliseconds. Forking is safe because this process stays single-threaded in Python (checked before
each fork): it opens no instance, no Spark session and no gRPC channel, and the native threads its
libraries start (jemalloc's background threads, OpenBLAS's) are ones those libraries make safe
across fork themselves.

Each run's process is this process's child and nothing more: it has its own pid (logged by Dagster
as "Started process for run"), is killed alone, and keeps running if this process dies. A run's
process exits as the CLI's does (`poison_pipeline.cli.shut_down`), without Python's finalization.

Started by `poison_pipeline.runs.launcher.WarmRunLauncher` as
`python -m poison_pipeline.runs.warm_server FD`, FD a socket to the launcher; ends when the
launcher closes it, or when a file it loaded changed (the launcher then starts a fresh one).
"""

from __future__ import annotations

import importlib
import os
import random
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from poison_pipeline.proc import process_start
from poison_pipeline.runs.code_files import CodeFiles


def _instance_modules(instance_ref: Any) -> list[str]:
    """The modules of the instance's configured classes (storages, compute logs, launcher...): a
    run imports them when it opens the instance; importing them opens nothing."""
    modules = []
    for value in instance_ref._asdict().values():
        module = getattr(value, "module_name", None)
        if isinstance(module, str):
            modules.append(module)
    return modules


def load(origin_json: str, instance_ref_json: str, preload: Sequence[str]) -> CodeFiles:
    """Import what a run imports and load the code location; what was read from disk to do so."""
    from dagster._core.origin import RepositoryPythonOrigin
    from dagster._serdes import deserialize_value
    from dagster._utils.hosted_user_process import recon_repository_from_origin

    from poison_pipeline.domain.declaration import declaration_path

    importlib.import_module("dagster._cli.api")
    for module in [*_instance_modules(deserialize_value(instance_ref_json)), *preload]:
        importlib.import_module(module)
    recon_repository_from_origin(deserialize_value(origin_json, RepositoryPythonOrigin)).get_definition()
    return CodeFiles(extra=[str(declaration_path())])


def _run(launcher: Connection, execute_run_args: str) -> None:
    """In the forked process: run the run as `dagster api execute_run` does, then exit."""
    from dagster._cli.api import execute_run_command

    from poison_pipeline.cli import shut_down
    from poison_pipeline.engine import local

    launcher.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the run waits for its own children
    signal.signal(signal.SIGINT, signal.default_int_handler)
    random.seed()  # not the sequence of every other run forked from here
    # Still single-threaded: the run's server of small-cycle workers is forked now, warm as well.
    local.warm(by_fork=True)
    code = 0
    try:
        execute_run_command.main(args=[execute_run_args], prog_name="dagster api execute_run",
                                 standalone_mode=False)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - Dagster logged what it could; the exit code says the rest
        traceback.print_exc()
        code = 1
    os._exit(shut_down(code))


def _fork(launcher: Connection, execute_run_args: str) -> dict[str, Any]:
    threads = threading.enumerate()
    if len(threads) != 1:
        return {"error": f"the warm run worker has threads ({', '.join(t.name for t in threads)}): "
                         "it does not fork"}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _run(launcher, execute_run_args)
    return {"pid": pid, "start": process_start(pid)}


def serve(fd: int) -> None:
    # Ctrl-C in the terminal of `dagster dev` reaches this process group: the runs handle it (as
    # runs started by Dagster's own launcher do) and this process ends when its launcher does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    launcher = Connection(fd)
    hello = launcher.recv()
    try:
        files = load(hello["origin"], hello["instance_ref"], hello["preload"])
    except BaseException as error:  # noqa: BLE001 - the launcher fails the run with it
        launcher.send({"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()})
        return
    launcher.send({"ready": os.getpid(), "files": len(files)})
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the runs' processes
    while True:
        try:
            request = launcher.recv()
        except (EOFError, OSError):
            return
        changed = files.changed()
        if changed:
            launcher.send({"stale": changed[:10]})
            return
        launcher.send(_fork(launcher, request["run"]))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
