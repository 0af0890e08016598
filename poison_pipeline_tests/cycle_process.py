"""Run one cycle in a process of its own, as a script or a second deployment would:
`python -m poison_pipeline_tests.cycle_process CONFIG QUEUE TABLE RUN_ID`; prints the report as JSON."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.engine.session import build_session
from poison_pipeline.operations.cycle import run_cycle


def main(config: str, queue: str, table: str, run_id: str) -> None:
    declaration = load_declaration(config)
    spark = build_session(declaration.spark)
    report = run_cycle(spark, declaration, queue, table, run_id=run_id)
    print(json.dumps(asdict(report)), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
