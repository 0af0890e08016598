"""A Dagster run launcher that hands each run to a warm, pre-imported process (`warm_server`), which
forks the run's own process: the run skips the Python start, `import dagster` and the loading of
the code location that Dagster's DefaultRunLauncher makes every run pay.

Configured in dagster.yaml (`run_launcher`). One warm process per code location and per process
that launches runs (the daemon's run queue launches them all when runs are queued), started at the
first run of that location. It is started afresh when a file it loaded (a module, the declaration)
changed, so a run always runs the code on disk, as a run of the DefaultRunLauncher does.

Each run's process is recorded in the run's tags (`WORKER_TAG`: pid and start time), read by run
monitoring (`check_run_worker_health`: a run whose process died is marked failed) and by
`terminate` (SIGTERM, which Dagster's run worker takes as an interrupt: the run ends canceled).
The run's process also logs "Started process for run (pid: N)" as every Dagster run worker does.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any, Self

from dagster import DagsterEventType, DagsterInstance, Field
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._core.storage.dagster_run import DagsterRun
from dagster._serdes import ConfigurableClass, ConfigurableClassData, serialize_value
from dagster._utils.error import SerializableErrorInfo

from poison_pipeline.proc import same_process

WORKER_TAG = "poison_pipeline/run_worker"
# What a run imports beyond Dagster, its instance and the code location: the engine and the Spark
# Connect client (a run that uses Spark), so that no run imports them again.
DEFAULT_PRELOAD = ("poison_pipeline.engine.cycle", "poison_pipeline.engine.local",
                   "poison_pipeline.operations.checks", "pyspark.sql.connect.session")
# Loading the code location takes seconds; one that takes this long is stuck.
LOAD_TIMEOUT_S = 600.0
_STARTED = re.compile(r"Started process for run \(pid: (\d+)\)")


class WarmServerError(RuntimeError):
    """The warm process could not load the code location, or went away."""

    def __init__(self, message: str, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


class WarmServer:
    """The launcher's end of one warm process."""

    def __init__(self, executable: str, origin_json: str, instance_ref_json: str, preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [executable, "-m", "poison_pipeline.runs.warm_server", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.connection = Connection(ours.detach())
        self.connection.send({"origin": origin_json, "instance_ref": instance_ref_json, "preload": list(preload)})
        reply = self._reply(LOAD_TIMEOUT_S)
        if "ready" not in reply:
            self.stop()
            raise WarmServerError(f"the code location could not be loaded for the run: {reply['error']}",
                                  reply.get("traceback"))

    def _reply(self, timeout: float) -> dict[str, Any]:
        try:
            if not self.connection.poll(timeout):
                self.stop()
                raise WarmServerError(f"the warm run worker did not answer within {timeout:.0f} s")
            return dict(self.connection.recv())
        except (EOFError, OSError):
            code = self.process.poll()
            raise WarmServerError(f"the warm run worker exited (exit code {code})") from None

    def fork(self, execute_run_args: str) -> dict[str, Any]:
        """The run's process ({"pid", "start"}), or {"stale": files} when the code changed on disk."""
        try:
            self.connection.send({"run": execute_run_args})
        except OSError:
            raise WarmServerError(f"the warm run worker exited (exit code {self.process.poll()})") from None
        return self._reply(60.0)

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Let the process go (it ends at the end of its input; the runs it forked go on)."""
        self.connection.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def worker_of(instance: DagsterInstance, run: DagsterRun) -> tuple[int, int | None] | None:
    """The run's process: (pid, start time) from its tag, else the pid its run worker logged (a run
    launched by another launcher); None when neither is known yet."""
    tag = run.tags.get(WORKER_TAG)
    if tag:
        pid_text, _, start = tag.partition(":")
        return int(pid_text), int(start) if start.isdigit() else None
    pid = logged_pid(instance, run.run_id)
    return (pid, None) if pid is not None else None


def logged_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The pid in the run's engine event "Started process for run (pid: N)", which every Dagster
    run worker logs (the last one, if the run was resumed)."""
    found = None
    for event in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        match = _STARTED.search(event.message or "")
        if match:
            found = int(match.group(1))
    return found


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a process forked from a warm process that has loaded its code location."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, preload: Sequence[str] | None = None) -> None:
        self._inst_data = inst_data
        self._preload = tuple(DEFAULT_PRELOAD if preload is None else preload)
        self._servers: dict[str, WarmServer] = {}
        self._lock = threading.Lock()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Field]:
        return {"preload": Field([str], is_required=False,
                                 description="Modules the warm process imports besides Dagster and the code location.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data, **config_value)

    def launch_run(self, context: LaunchRunContext) -> None:
        from dagster._grpc.types import ExecuteRunArgs

        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None:
            raise DagsterLaunchFailedError(f"run {run.run_id} has no code origin to run")
        args = serialize_value(ExecuteRunArgs(job_origin=origin, run_id=run.run_id,
                                              instance_ref=self._instance.get_ref()))
        try:
            pid, start = self._fork(origin.repository_origin, origin.executable_path or sys.executable, args)
        except WarmServerError as error:
            info = SerializableErrorInfo(str(error), [error.details] if error.details else [], "WarmServerError")
            raise DagsterLaunchFailedError(str(error), serializable_error_info=info) from None
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: f"{pid}:{start if start is not None else ''}"})

    def _fork(self, repository_origin: Any, executable: str, args: str) -> tuple[int, int | None]:
        key = serialize_value(repository_origin)
        with self._lock:
            # A second try only after the warm process ended (code changed on disk, or it was killed).
            for _ in range(2):
                server = self._servers.get(key)
                if server is None or not server.running():
                    server = WarmServer(executable, key, serialize_value(self._instance.get_ref()), self._preload)
                    self._servers[key] = server
                try:
                    reply = server.fork(args)
                except WarmServerError:
                    self._servers.pop(key).stop()
                    continue
                if "stale" in reply:
                    self._servers.pop(key).stop()
                    continue
                if "error" in reply:
                    raise WarmServerError(reply["error"])
                return int(reply["pid"]), reply["start"]
        raise WarmServerError("the warm run worker exited twice while starting the run")

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        worker = worker_of(self._instance, run)
        if worker is None or not same_process(*worker):
            self._instance.report_engine_event("The run's process is not running: nothing to terminate.",
                                               run, cls=self.__class__)
            return False
        # Dagster's run worker takes SIGTERM as an interrupt: it stops its steps and ends the run canceled.
        os.kill(worker[0], signal.SIGTERM)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        worker = worker_of(self._instance, run)
        if worker is None:
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "no process recorded for the run")
        pid, start = worker
        if same_process(pid, start):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(pid))
        return CheckRunHealthResult(WorkerStatus.FAILED, f"the run's process (pid {pid}) exited before the run ended",
                                    run_worker_id=str(pid))

    def get_run_worker_debug_info(self, run: DagsterRun, include_container_logs: bool | None = True) -> str | None:
        worker = worker_of(self._instance, run)
        if worker is None:
            return None
        state = "running" if same_process(*worker) else "exited"
        return f"run worker pid {worker[0]} ({state})"

    def dispose(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()
