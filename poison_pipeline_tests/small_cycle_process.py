"""Run small cycles in a process of its own, with this process's environment for the handlers (the
fork server that delivers them is started here, so it sees e.g. $POISON_PIPELINE_APP_DB):
`python -m poison_pipeline_tests.small_cycle_process CONFIG QUEUE/TABLE...`; prints one JSON report
a line. Spark is never started: a cycle that would need it fails."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from pyspark.sql import SparkSession

from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.cycle import run_cycle


def _no_spark() -> SparkSession:
    raise AssertionError("this process runs small cycles only: no Spark session is built")


def main(config: str, cycles: list[str]) -> None:
    declaration = load_declaration(config)
    for cycle in cycles:
        queue, table = cycle.split("/")
        report = run_cycle(_no_spark, declaration, queue, table)
        print(json.dumps(asdict(report), default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
