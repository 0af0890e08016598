"""The same declaration on a real cluster (issue 10, item 8): a Spark standalone cluster (a master
and two workers, each a JVM of its own) and a Spark Connect server, both started from pyspark's own
scripts on this machine and stopped by their process ids, leaving no process behind.

Each test runs a full cycle with poison, duplicates and a conversation from a driver process of its
own and checks the Delta tables. Staging, journal and in-flight markers live under the lake root, so
executors and driver only share that folder."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from poison_pipeline.defs.resources import REMOTE_ENV
from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration
from poison_pipeline.engine.local_servers import ConnectServer, SparkProcess, alive, start_connect_server
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.uri import fs_of
from poison_pipeline_tests.dagster_support import write_config
from poison_pipeline_tests.s3_support import fresh_root
from poison_pipeline_tests.standalone import StandaloneCluster, start_cluster
from poison_pipeline_tests.support import HANDLER, attempts_of, places

pytestmark = [pytest.mark.e2e, pytest.mark.full]

REPO = Path(__file__).resolve().parent.parent
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0,
          "receive_error_handling": "move", "ordering": "conversation"}
# Small enough for two cores: one core and 512 MB per worker, one executor on each.
EXECUTORS = {"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2",
             "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}


@contextlib.contextmanager
def _stopped_cleanly(processes: list[SparkProcess]) -> Iterator[None]:
    """Stop every process by its id after the test, whatever happened, and check none is left."""
    started = set().union(*(p.processes() for p in processes))
    assert started, "the servers are running"
    try:
        yield
    finally:
        # Again now: executors and Python workers started during the test count too.
        started |= set().union(*(p.processes() for p in processes))
        for process in processes:
            process.stop()
    left = sorted(pid for pid in started if alive(pid))
    assert not left, f"processes left after stopping the servers: {left}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    started = start_cluster(tmp_path / "cluster", pythonpath=[str(REPO)])
    assert len(started.workers) == 2 and len({w.pid for w in started.workers} | {started.master.pid}) == 3
    with _stopped_cleanly(started.processes):
        yield started


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator[ConnectServer]:
    server = start_connect_server(SparkSettings(master="local[2]", config={"spark.sql.shuffle.partitions": "2"}),
                                  tmp_path / "connect", pythonpath=[str(REPO)])
    with _stopped_cleanly([server.process]):
        yield server


def _declaration(tmp_path: Path, spark: dict[str, Any], **lake: Any) -> tuple[Declaration, str]:
    """`lake`: lake_root and storage_options (default: a folder of the test's own)."""
    declaration = parse_declaration({"lake_root": str(tmp_path / "lake"), **lake, "spark": spark,
                                     "queues": {"q": {"handler": HANDLER, "policy": POLICY}}})
    return declaration, str(write_config(declaration, tmp_path / "declaration.yaml"))


def _envelopes(tmp_path: Path, name: str, bodies: dict[str, dict[str, Any]], **extra: Any) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps([{"message_id": mid, "message_type": "test", "body": body, **extra.get(mid, {})}
                                for mid, body in bodies.items()]))
    return f"@{path}"


def _scenario(tmp_path: Path) -> list[str]:
    """Enqueues and cycles: twins in two enqueues, an id processed then sent again, a conversation
    whose second message fails its first cycle (holding the third), and a message that always fails."""
    conversation = {f"c1-{n}": {"conversation_id": "c1", "sequence_number": n} for n in (1, 2, 3)}
    first = {**{f"ok-{n:02d}": {} for n in range(20)}, "dup": {}, "twin": {},
             "c1-1": {}, "c1-2": {"fail_until_cycle": 1}, "c1-3": {}, "poison": {"fail": True}}
    return [
        _envelopes(tmp_path, "first", first, **conversation),
        _envelopes(tmp_path, "twin", {"twin": {}}),
        "inbound",
        _envelopes(tmp_path, "again", {"dup": {}}),
        "inbound", "retry_1", "poison",
    ]


def _drive(config: str, steps: list[str], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "poison_pipeline_tests.cluster_process", config, *steps],
                          cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _check_tables(declaration: Declaration) -> None:
    found = places(declaration)
    assert {mid: found[mid] for mid in found if mid.startswith("ok-")} == {
        f"ok-{n:02d}": ["processed:processed"] for n in range(20)}
    assert sorted(found["dup"]) == ["processed:duplicate", "processed:processed"]
    assert sorted(found["twin"]) == ["processed:duplicate", "processed:processed"]
    assert found["poison"] == ["quarantine"]
    for n in (1, 2, 3):
        assert found[f"c1-{n}"] == ["processed:processed"]
    outcomes = {mid: [(a["cycle"], a["attempt"], a["outcome"]) for a in attempts_of(declaration, mid)]
                for mid in ("c1-2", "c1-3", "poison")}
    assert outcomes == {
        "c1-2": [(0, 1, "abort"), (0, 2, "abort"), (1, 1, "success")],
        "c1-3": [(1, 1, "success")],  # held behind c1-2 in cycle 0, never delivered ahead of it
        "poison": [(0, 1, "abort"), (0, 2, "abort"), (1, 1, "abort"), (1, 2, "abort")],
    }
    second, third = (attempts_of(declaration, mid)[-1]["started_at"] for mid in ("c1-2", "c1-3"))
    assert second <= third


def _ran_on_both_workers(cluster: StandaloneCluster) -> None:
    """Each worker ran an executor of the app. Spark may replace one it lost (a loaded machine
    misses a heartbeat): a third executor is a replacement, not a failure."""
    ran = {worker.log.parent.name: list((worker.log.parent / "work").glob("app-*/*")) for worker in cluster.workers}
    assert len(ran) == 2 and all(ran.values()), ran


def test_a_full_cycle_on_a_standalone_cluster_of_two_workers(cluster: StandaloneCluster, tmp_path: Path) -> None:
    declaration, config = _declaration(tmp_path, {"master": cluster.url, "config": EXECUTORS})
    reports = _drive(config, _scenario(tmp_path))
    _check_tables(declaration)
    assert [r["table"] for r in reports[:-1]] == ["inbound", "inbound", "retry_1", "poison"]
    assert reports[-1] == {"jvm": True}
    # The work ran on the workers' executors: each worker launched one for this application.
    _ran_on_both_workers(cluster)
    # Nothing of the cycles is left where only one process could read it.
    assert not list((Path(declaration.lake_root) / "q" / "_work" / "staging").glob("*/*"))


def test_a_full_cycle_on_a_standalone_cluster_with_the_lake_on_the_s3_server(
        cluster: StandaloneCluster, s3_server: dict[str, str], tmp_path: Path) -> None:
    """The workers reach the S3 lake with the lake's storage options alone: no Hadoop connector on
    any JVM; the due messages and the ledgers are read, and the results staged, through Arrow."""
    declaration, config = _declaration(tmp_path, {"master": cluster.url, "config": EXECUTORS},
                                       lake_root=fresh_root("cluster"), storage_options=s3_server)
    reports = _drive(config, ["--big", *_scenario(tmp_path)])
    _check_tables(declaration)
    assert [r["table"] for r in reports[:-1]] == ["inbound", "inbound", "retry_1", "poison"]
    _ran_on_both_workers(cluster)
    fs, staging = fs_of(QueueTables.of(declaration, "q").work_uri("staging"), s3_server)
    assert [info.path for info in fs.get_file_info(pafs.FileSelector(staging, recursive=True, allow_not_found=True))
            if info.type == pafs.FileType.File] == []


def test_dagster_runs_of_the_declaration_on_a_spark_connect_server(connect_server: ConnectServer,
                                                                   tmp_path: Path) -> None:
    # The declaration says local[*]; the deployment points its runs at the server ($POISON_PIPELINE_SPARK_REMOTE).
    declaration, config = _declaration(tmp_path, {"master": "local[*]"})
    reports = _drive(config, ["--dagster", *_scenario(tmp_path)], env={REMOTE_ENV: connect_server.session_url()})
    _check_tables(declaration)
    assert reports[:-1] == [{"table": t, "success": True, "run_id": r["run_id"]}
                            for t, r in zip(["inbound", "inbound", "retry_1", "poison"], reports, strict=False)]
    assert reports[-1] == {"jvm": False}, "the runs used the server, not a JVM of their own"
