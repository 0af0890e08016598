"""The soak's Dagster: `dagster dev` (webserver and daemon, whose sensors launch the cycles) on a
temporary DAGSTER_HOME, what it ran, and kill -9 of a run's process tree."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOCATION = "poison_pipeline"
REPOSITORY = "__repository__"  # the name Dagster gives a module's Definitions
ASSET_JOB = "__ASSET_JOB"  # the job an asset page's "Materialize" launches: it has no job tags
UNFINISHED = (DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
              DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


def dagster_home(folder: Path) -> Path:
    """The repo's dagster.yaml (one run per queue tag, no run retries) with its folders made absolute,
    so the soak's own instance and `dagster dev` (run from the home folder) share one storage."""
    home = folder / "dagster_home"
    home.mkdir(parents=True)
    config = yaml.safe_load((REPO / "dagster.yaml").read_text())
    for section in ("storage", "local_artifact_storage", "compute_logs"):
        holder = config[section].get("sqlite", config[section].get("config"))
        holder["base_dir"] = str(home / holder["base_dir"])
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    (home / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [
        {"python_module": {"module_name": "poison_pipeline.definitions", "location_name": LOCATION}}]}))
    return home


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(root: int) -> list[int]:
    """`root` and every process under it (from /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def freeze(root: int) -> dict[int, int | None]:
    """SIGSTOP `root` and its descendants, again until none is new (so that none forks a child that
    outlives a kill): {pid: start time} of the processes frozen, empty if `root` is gone."""
    from poison_pipeline.proc import process_start

    frozen: dict[int, int | None] = {}
    while True:
        found = [pid for pid in descendants(root) if pid not in frozen]
        if not found:
            return frozen
        for pid in found:
            frozen[pid] = process_start(pid)
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                frozen.pop(pid)
        if root not in frozen:
            thaw(frozen)
            return {}


def thaw(frozen: dict[int, int | None]) -> None:
    for pid in frozen:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def kill_frozen(frozen: dict[int, int | None]) -> list[tuple[int, int | None]]:
    """kill -9 the processes `freeze` stopped; the (pid, start time) of each."""
    for pid in frozen:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return list(frozen.items())


def kill_tree(root: int) -> list[tuple[int, int | None]]:
    """kill -9 `root` and its descendants, frozen first."""
    return kill_frozen(freeze(root))


class DagsterDev:
    """`dagster dev` in a session of its own, output to a log file; stopped by pid."""

    def __init__(self, home: Path, config: Path, app_db: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "DAGSTER_HOME": str(home), "POISON_PIPELINE_CONFIG": str(config),
               "POISON_PIPELINE_APP_DB": str(app_db), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, **(env or {})}
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(BIN / "dagster"), "dev", "-w", str(home / "workspace.yaml"), "-h", "127.0.0.1",
                 "-p", str(self.port)],
                cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.load(response)
        if "errors" in payload:
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        return dict(payload["data"])

    def wait_ready(self, timeout_s: float) -> None:
        """Until the webserver answers with the code location loaded."""
        deadline = time.monotonic() + timeout_s
        query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dagster dev exited ({self.process.returncode}):\n{self.tail()}")
            try:
                entries = self.graphql(query)["workspaceOrError"]["locationEntries"]
                if any(e["name"] == LOCATION and e["loadStatus"] == "LOADED" for e in entries):
                    return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"dagster dev was not ready after {timeout_s}s:\n{self.tail()}")

    def materialize(self, queue: str, table: str) -> str:
        """Launch what an asset page's "Materialize" launches (the asset job, no job tags): only the
        queue's lease keeps it apart from a cycle already running. The run id."""
        return self.launch(ASSET_JOB, [{"path": [queue, table]}], {"poison_pipeline/soak": "concurrent"})

    def launch(self, job: str, assets: list[dict[str, list[str]]] | None = None,
               tags: dict[str, str] | None = None) -> str:
        """Launch `job` as the UI's launchRun does (the job's own tags and `tags`). The run id."""
        mutation = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
            ... on InvalidStepError { invalidStepKey } ... on RunConfigValidationInvalid { errors { message } } } }"""
        selector: dict[str, Any] = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": job}
        if assets is not None:
            selector.update(assetSelection=assets, assetCheckSelection=[])
        params = {"selector": selector, "runConfigData": {}, "mode": "default", "executionMetadata": {
            "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}}
        result = self.graphql(mutation, {"params": params})["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launchRun of {job} {assets or ''} failed: {result}")
        return str(result["run"]["runId"])

    def stop_sensors(self) -> list[str]:
        """Stop every sensor of the code location, as a user does from the UI. Their names."""
        query = """query($repo: RepositorySelector!) { sensorsOrError(repositorySelector: $repo) {
            __typename ... on Sensors { results { name sensorState { id } } } } }"""
        repo = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
        sensors = self.graphql(query, {"repo": repo})["sensorsOrError"]["results"]
        mutation = """mutation($id: String!) { stopSensor(id: $id) { __typename
            ... on StopSensorMutationResult { instigationState { status } } ... on PythonError { message } } }"""
        for sensor in sensors:
            result = self.graphql(mutation, {"id": sensor["sensorState"]["id"]})["stopSensor"]
            if result["__typename"] != "StopSensorMutationResult":
                raise RuntimeError(f"stopSensor {sensor['name']} failed: {result}")
        return [sensor["name"] for sensor in sensors]

    def stop(self) -> None:
        """SIGTERM to the session, then kill -9 whatever of it is left (runs, their fork servers and
        Spark JVMs included, whose Python workers pyspark puts in groups of their own), by pid."""
        from poison_pipeline.proc import process_start

        seen = {pid: process_start(pid) for pid in descendants(self.process.pid)}
        if self.process.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(15)
        seen.update({pid: process_start(pid) for pid in descendants(self.process.pid)})
        for pid, start in seen.items():
            if pid != self.process.pid and start is not None and process_start(pid) == start:
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    job: str
    status: str
    queue: str | None
    table: str | None
    tags: dict[str, str]
    start: float | None
    end: float | None


def cycle_of(job: str) -> tuple[str, str] | None:
    """(queue, table) of a cycle job `<queue>__<table>_cycle`, else None."""
    if not job.endswith("_cycle") or "__" not in job:
        return None
    queue, rest = job.split("__", 1)
    return queue, rest.removesuffix("_cycle")


def runs(instance: DagsterInstance, statuses: tuple[DagsterRunStatus, ...] = ()) -> list[RunInfo]:
    found = []
    records = instance.get_run_records(filters=RunsFilter(statuses=list(statuses)) if statuses else None)
    for record in records:
        run = record.dagster_run
        cycle = cycle_of(run.job_name)
        if run.job_name == ASSET_JOB and run.asset_selection:
            [key] = list(run.asset_selection)
            cycle = (key.path[0], key.path[1])
        found.append(RunInfo(run.run_id, run.job_name, run.status.value, cycle[0] if cycle else None,
                             cycle[1] if cycle else None, dict(run.tags), record.start_time, record.end_time))
    return found


def run_pid(instance: DagsterInstance, run_id: str) -> int | None:
    """The run worker's pid, from its engine event "Started process for run (pid: N)"."""
    from poison_pipeline.runs.launcher import logged_pid

    return logged_pid(instance, run_id)


def run_log_text(instance: DagsterInstance, run_id: str) -> str:
    """Every message of a run's event log, and each failed step's error with its causes (the
    error's own lines first: the stack of a long one would crowd them out)."""
    texts, errors = [], []
    for event in instance.all_logs(run_id):
        texts.append(event.message or "")
        dagster_event = event.dagster_event
        if dagster_event is not None and dagster_event.is_step_failure and dagster_event.step_failure_data:
            error = dagster_event.step_failure_data.error
            while error is not None:
                errors.append(f"{error.cls_name}: {error.message.strip()}")
                error = error.cause
    return "\n".join(errors + texts)


def cycle_materializations(instance: DagsterInstance, run_id: str) -> list[dict[str, Any]]:
    """The metadata of the waiting-table cycles a run materialized, with the event's timestamp."""
    found = []
    for event in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        materialization = event.dagster_event.step_materialization_data.materialization  # type: ignore[union-attr]
        meta = {k: v.value for k, v in materialization.metadata.items()}
        if "duration_s" in meta and "messages" in meta:
            path = materialization.asset_key.path
            found.append({"queue": path[0], "table": path[1], "at": event.timestamp, **meta})
    return found
