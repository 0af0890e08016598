"""Run Dagster jobs in a process of its own, everything it prints going where its caller points
stdout and stderr (Spark's JVM included, which a fixture's session would not give):
`python -m poison_pipeline_tests.dagster_run_process DAGSTER_HOME CONFIG:JOB...`. The instance keeps
its storage (sqlite event logs, compute logs) in DAGSTER_HOME; Python logging goes to stderr at
DEBUG, as does Dagster's own. Prints one JSON line per run: job, success, error text."""

from __future__ import annotations

import json
import logging
import sys

from dagster import DagsterInstance

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import load_declaration

LOUD = {"loggers": {"console": {"config": {"log_level": "DEBUG"}}}}


def main(home: str, runs: list[str]) -> None:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    with DagsterInstance.local_temp(tempdir=home) as instance:
        for run in runs:
            config, job = run.rsplit(":", 1)
            definitions = build_definitions(load_declaration(config))
            result = definitions.resolve_job_def(job).execute_in_process(
                instance=instance, run_config=LOUD, raise_on_error=False)
            errors = [e.step_failure_data.error.to_string() for e in result.all_events
                      if e.is_step_failure and e.step_failure_data is not None]
            print(json.dumps({"job": job, "success": result.success, "errors": errors}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
