"""Spark servers started on this machine from pyspark's own scripts: a Spark Connect server (for
`make ui`, the benchmarks and the tests) and the JVMs of a standalone cluster (the tests).

Each runs in a process group of its own, bound to localhost, and is stopped by that group's id:
the JVM, the shell that launched it and the Python workers it forked all go, even when whoever
started it fails (its stop is also registered with atexit).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyspark

from poison_pipeline.domain.declaration import SparkSettings
from poison_pipeline.engine.session import session_config
from poison_pipeline.proc import alive

SPARK_HOME = Path(pyspark.__file__).parent
LOCALHOST = "127.0.0.1"


def free_port() -> int:
    """A port nobody listens on now (the server binds it a moment later; a clash fails loudly)."""
    with socket.socket() as probe:
        probe.bind((LOCALHOST, 0))
        return int(probe.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((LOCALHOST, port)) == 0


def spark_environment(workdir: Path, pythonpath: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a server's processes: this interpreter for the Python workers it starts,
    `pythonpath` in front so they import the handlers, and its pid and log files kept in `workdir`
    (pyspark's scripts refuse to start a second server whose pid file is in the shared /tmp)."""
    env = dict(os.environ)
    paths = [str(Path(p).resolve()) for p in pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP=LOCALHOST,
        SPARK_LOG_DIR=str(workdir / "logs"),
        SPARK_PID_DIR=str(workdir),
        PYTHONPATH=os.pathsep.join(paths),
    )
    return env



def process_links() -> dict[int, tuple[int, int]]:
    """(parent, process group) of every live process on this machine (zombies left out), from /proc."""
    links: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Fields after the command's closing parenthesis: state, ppid, pgrp.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                links[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return links

class SparkProcess:
    """One started server process and its group; the log holds everything it printed."""

    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str], log: Path) -> None:
        self.name, self.log = name, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                list(command), env=dict(env), cwd=log.parent, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.pid = self.process.pid
        atexit.register(self.stop)

    def processes(self) -> set[int]:
        """Every live process the server started: its group, and the Python workers' daemons,
        which pyspark puts in groups of their own."""
        links = process_links()
        found = {pid for pid, (_, group) in links.items() if group == self.pid}
        frontier = set(found) | {self.pid}
        while frontier:
            frontier = {pid for pid, (parent, _) in links.items() if parent in frontier and pid not in found}
            found |= frontier
        return found

    def exited(self) -> bool:
        return self.process.poll() is not None

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the group (Spark's shutdown hooks stop its workers), then SIGKILL to whatever
        of it is left after `grace`."""
        atexit.unregister(self.stop)
        started = self.processes()
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            for pid in started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while started and time.monotonic() < deadline:
                self.process.poll()  # reaps the launching shell, our own child
                started = {pid for pid in started if alive(pid)}
                time.sleep(0.1)
            if not started:
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def wait_until(ready: Callable[[], bool], processes: Sequence[SparkProcess], what: str, timeout: float) -> None:
    """Poll `ready`; fail with the log of a process that exited, or of all on a timeout."""
    deadline = time.monotonic() + timeout
    while not ready():
        for process in processes:
            if process.exited():
                raise RuntimeError(f"{process.name} exited with code {process.process.returncode} before {what}; "
                                   f"its log ({process.log}) ends with:\n{process.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name} ({p.log}):\n{p.tail()}" for p in processes)
            raise TimeoutError(f"{what} did not happen within {timeout:g}s\n{logs}")
        time.sleep(0.2)


@dataclass
class ConnectServer:
    process: SparkProcess
    port: int

    @property
    def url(self) -> str:
        return f"sc://{LOCALHOST}:{self.port}"

    def session_url(self) -> str:
        """A URL naming one new server-side session for every process that uses it: each Connect
        session starts Python workers of its own (they are keyed by the session) and keeps them
        until the server stops, so runs that share one pay no worker start and leave none behind."""
        return f"{self.url}/;session_id={uuid.uuid4()}"

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_connect_server(
    settings: SparkSettings,
    workdir: Path,
    pythonpath: Sequence[str] = (),
    port: int | None = None,
    timeout: float = 180.0,
) -> ConnectServer:
    """Start pyspark's Spark Connect server with the session settings of `settings` (its master and
    configuration: the server is the driver of every client's session), listening on localhost
    only, and return once it accepts connections. Its UDFs run in this interpreter, importing
    from `pythonpath` and this venv."""
    port = port or free_port()
    conf = {
        **session_config(settings),
        "spark.connect.grpc.binding.address": LOCALHOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": LOCALHOST,
        "spark.driver.bindAddress": LOCALHOST,
        # A shared session (`session_url`) must outlive idle hours: once expired, its id is refused.
        "spark.connect.session.manager.defaultSessionTimeout": "-1",
    }
    command = [str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait", "--master", settings.master]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    process = SparkProcess("Spark Connect server", command, spark_environment(workdir, pythonpath),
                           workdir / "connect-server.log")
    try:
        wait_until(lambda: port_open(port), [process], f"the Spark Connect server listened on port {port}", timeout)
    except BaseException:
        process.stop()
        raise
    return ConnectServer(process, port)
