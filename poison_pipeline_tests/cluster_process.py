"""A driver of its own for the cluster tests, as a deployment's process would be:
`python -m poison_pipeline_tests.cluster_process CONFIG [--dagster] [--big] STEP...` where a STEP is
a waiting table of queue `q` to run a cycle of, or `@FILE` (JSON list of envelopes) to enqueue.
`--big`: every cycle takes the big path (duplicates, ended conversations and blocked ones found by
joins in Spark, which reads the ledgers), however few its messages.

Cycles run with the declaration's Spark settings (`run_cycle`), or with `--dagster` as runs of the
product's own cycle job (its Spark resource honours $POISON_PIPELINE_SPARK_REMOTE). Prints one JSON
line per cycle, then whether this process started a JVM of its own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from poison_pipeline.defs.naming import job_name
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.engine.session import build_session
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue

QUEUE = "q"


def _dagster_cycle(config: str, table: str) -> dict[str, object]:
    from dagster import DagsterInstance, build_reconstructable_job, execute_job

    job = build_reconstructable_job("poison_pipeline_tests.dagster_support", "job_of",
                                    reconstructable_args=(config, job_name(QUEUE, table)))
    with DagsterInstance.ephemeral() as instance:
        result = execute_job(job, instance, raise_on_error=True)
    return {"table": table, "success": result.success, "run_id": result.run_id}


def main(config: str, *steps: str) -> None:
    declaration = load_declaration(config)
    dagster = "--dagster" in steps
    if "--big" in steps:
        from poison_pipeline.engine import cycle

        cycle.SMALL_BATCH = 0
    spark = None
    for step in steps:
        if step in ("--dagster", "--big"):
            continue
        if step.startswith("@"):
            with open(step[1:]) as records:
                refused = enqueue(declaration, QUEUE, json.load(records)).refused
            assert not refused, refused
        elif dagster:
            print(json.dumps(_dagster_cycle(config, step)), flush=True)
        else:
            spark = spark or build_session(declaration.spark)
            print(json.dumps(asdict(run_cycle(spark, declaration, QUEUE, step)), default=str), flush=True)
    from pyspark import SparkContext

    print(json.dumps({"jvm": SparkContext._jvm is not None}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
