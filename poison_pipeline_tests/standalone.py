"""A Spark standalone cluster on this machine for the cluster tests: a master and workers, each a JVM
of its own started with pyspark's `bin/spark-class`, on localhost and free ports."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from poison_pipeline.engine.local_servers import (
    LOCALHOST,
    SPARK_HOME,
    SparkProcess,
    free_port,
    spark_environment,
    wait_until,
)


@dataclass
class StandaloneCluster:
    master: SparkProcess
    workers: list[SparkProcess]
    port: int
    ui_port: int

    @property
    def url(self) -> str:
        return f"spark://{LOCALHOST}:{self.port}"

    @property
    def processes(self) -> list[SparkProcess]:
        return [*self.workers, self.master]

    def alive_workers(self) -> int:
        with contextlib.suppress(OSError, ValueError), \
                urllib.request.urlopen(f"http://{LOCALHOST}:{self.ui_port}/json/", timeout=2) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
        return 0

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


def start_cluster(workdir: Path, pythonpath: list[str], workers: int = 2, memory: str = "512m",
                  timeout: float = 180.0) -> StandaloneCluster:
    """Start the master and `workers` workers (one core and `memory` each) and return once every
    worker has registered. The workers' executors run this interpreter with `pythonpath`: what an
    installed package is on a real cluster's workers."""
    env = {**spark_environment(workdir, pythonpath), "SPARK_DAEMON_MEMORY": "256m"}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui_port = free_port(), free_port()
    master = SparkProcess("standalone master", [
        spark_class, "org.apache.spark.deploy.master.Master",
        "--host", LOCALHOST, "--port", str(port), "--webui-port", str(ui_port),
    ], env, workdir / "master" / "master.log")
    cluster = StandaloneCluster(master, [], port, ui_port)
    try:
        for n in range(workers):
            folder = workdir / f"worker-{n}"
            cluster.workers.append(SparkProcess(f"standalone worker {n}", [
                spark_class, "org.apache.spark.deploy.worker.Worker",
                "--host", LOCALHOST, "--webui-port", str(free_port()), "--cores", "1", "--memory", memory,
                "--work-dir", str(folder / "work"), cluster.url,
            ], env, folder / "worker.log"))
        wait_until(lambda: cluster.alive_workers() == workers, cluster.processes,
                   f"{workers} workers registered with the master", timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
