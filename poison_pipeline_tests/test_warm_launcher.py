"""The warm run launcher (poison_pipeline/runs), as dagster.yaml configures it for `make ui`: each run
in a process of its own forked from one warm process, run monitoring of that process, termination,
and code changed on disk picked up by the next run.

Runs are created and launched through the instance as the daemon's run queue launches them
(`instance.launch_run`); the whole path through `dagster dev`'s UI is timed by
benchmarks/connect_run.py and run by the e2e tests that start `dagster dev` with the repo's
dagster.yaml. Each test uses queues of its own (each queue is a folder of its own in the lake).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.launcher import WorkerStatus
from dagster._core.test_utils import instance_for_test
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from poison_pipeline.defs.naming import job_name
from poison_pipeline.domain.declaration import CONFIG_ENV, load_declaration
from poison_pipeline.engine.local_servers import process_links
from poison_pipeline.operations.records import enqueue
from poison_pipeline.proc import alive
from poison_pipeline.runs.launcher import WORKER_TAG, WarmRunLauncher, logged_pid
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.dagster_support import job_of
from poison_pipeline_tests.support import places

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = {"module": "poison_pipeline.runs.launcher", "class": "WarmRunLauncher"}
HANDLER = "poison_pipeline_tests.handlers:scripted"
POLICY = {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"}
QUEUES = ("done", "killed", "beside", "canceled")
TIMEOUT_S = 120.0


def _write(config: Path, lake: Path, queues: tuple[str, ...]) -> None:
    config.write_text(yaml.safe_dump({
        "lake_root": str(lake), "spark": SPARK.model_dump(),
        "queues": {q: {"handler": HANDLER, "policy": POLICY} for q in queues}}))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DagsterInstance, Path]]:
    """One instance with the warm launcher, its warm process shared by the module's tests."""
    folder = tmp_path_factory.mktemp("warm")
    config = folder / "poison_pipeline.yaml"
    _write(config, folder / "lake", QUEUES)
    (folder / "home").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CONFIG_ENV, str(config))
        # The warm process takes this process's environment: the tests' handlers import there.
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        with instance_for_test(temp_dir=str(folder / "home"), overrides={"run_launcher": LAUNCHER}) as instance:
            assert isinstance(instance.run_launcher, WarmRunLauncher)
            yield instance, config


def _launch(instance: DagsterInstance, config: Path, queue: str) -> str:
    """Create the queue's inbound cycle run from the code location's module and launch it."""
    name = job_name(queue, "inbound")
    job = job_of(str(config), name)
    origin = ReconstructableRepository.for_module("poison_pipeline.definitions", "defs").get_reconstructable_job(name)
    run = instance.create_run_for_job(job_def=job, job_code_origin=origin.get_python_origin(), tags=job.tags)
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]  # the launcher needs none
    return run.run_id


def _enqueue(config: Path, queue: str, bodies: list[dict[str, Any]], first: int = 0) -> None:
    records = [{"message_id": f"{queue}-{first + i}", "message_type": "t", "body": body}
               for i, body in enumerate(bodies)]
    assert not enqueue(load_declaration(config), queue, records).refused


def _wait(instance: DagsterInstance, run_id: str, *statuses: DagsterRunStatus) -> DagsterRunStatus:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        if run.status in statuses:
            return run.status
        assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
        time.sleep(0.1)


def _worker(instance: DagsterInstance, run_id: str) -> int:
    """The run's process, once it has logged itself."""
    deadline = time.monotonic() + TIMEOUT_S
    while (pid := logged_pid(instance, run_id)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return pid


def _tree(root: int) -> list[int]:
    links = process_links()
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, (parent, _) in links.items() if parent in frontier]
        found += frontier
    return found


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(pid) for pid in pids)


def test_each_run_has_a_process_of_its_own_forked_from_one_warm_process(deployment):
    instance, config = deployment
    pids = []
    for round_ in range(2):
        _enqueue(config, "done", [{}, {"fail": True}] if round_ == 0 else [{}], first=2 * round_)
        run_id = _launch(instance, config, "done")
        assert _wait(instance, run_id, DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE) == DagsterRunStatus.SUCCESS
        pid = logged_pid(instance, run_id)
        assert pid is not None and pid != os.getpid()
        assert instance.get_run_by_id(run_id).tags[WORKER_TAG].split(":")[0] == str(pid)  # type: ignore[union-attr]
        pids.append(pid)
    assert pids[0] != pids[1]
    assert _gone(pids), "a run's process outlived its run"
    where = places(load_declaration(config), "done")
    assert where == {"done-0": ["processed:processed"], "done-1": ["poison"], "done-2": ["processed:processed"]}
    [server] = instance.run_launcher._servers.values()  # type: ignore[attr-defined]
    assert server.running(), "the warm process ended with a run"


def test_a_killed_run_process_fails_its_run_alone_and_monitoring_marks_it_failed(deployment):
    instance, config = deployment
    _enqueue(config, "killed", [{"sleep": 20}])
    _enqueue(config, "beside", [{"sleep": 3}, {}])
    killed = _launch(instance, config, "killed")
    pid = _worker(instance, killed)
    _wait(instance, killed, DagsterRunStatus.STARTED)
    beside = _launch(instance, config, "beside")
    _worker(instance, beside)
    tree = _tree(pid)
    for each in tree:
        os.kill(each, signal.SIGKILL)
    assert _gone(tree)
    health = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(killed))
    assert health.status == WorkerStatus.FAILED and str(pid) in (health.msg or "")
    record = instance.get_run_record_by_id(killed)
    monitor_started_run(instance, None, record, logging.getLogger("test"))  # type: ignore[arg-type]  # the daemon's own check
    assert instance.get_run_by_id(killed).status == DagsterRunStatus.FAILURE  # type: ignore[union-attr]
    assert _wait(instance, beside, DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE) == DagsterRunStatus.SUCCESS
    processed = ["processed:processed"]
    assert places(load_declaration(config), "beside") == {"beside-0": processed, "beside-1": processed}
    assert places(load_declaration(config), "killed") == {"killed-0": ["inbound"]}  # not lost: waits for a cycle


def test_terminate_cancels_the_run_and_ends_its_process(deployment):
    instance, config = deployment
    _enqueue(config, "canceled", [{"sleep": 20}])
    run_id = _launch(instance, config, "canceled")
    pid = _worker(instance, run_id)
    _wait(instance, run_id, DagsterRunStatus.STARTED)
    time.sleep(1.0)  # inside the cycle's delivery
    assert instance.run_launcher.terminate(run_id)
    assert _wait(instance, run_id, DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE,
                 DagsterRunStatus.SUCCESS) == DagsterRunStatus.CANCELED
    assert _gone([pid])
    assert places(load_declaration(config), "canceled") == {"canceled-0": ["inbound"]}
    assert not instance.run_launcher.terminate(run_id)  # finished: nothing to terminate


def test_a_changed_declaration_is_what_the_next_run_runs(deployment):
    instance, config = deployment
    _write(config, Path(load_declaration(config).lake_root), (*QUEUES, "added"))
    _enqueue(config, "added", [{}])
    run_id = _launch(instance, config, "added")  # a job the warm process did not have
    assert _wait(instance, run_id, DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE) == DagsterRunStatus.SUCCESS
    assert places(load_declaration(config), "added") == {"added-0": ["processed:processed"]}
