"""Helpers of the Dagster operator tests: a lake built once per module and copied for each test, the
definitions of a declaration file (reconstructable, for re-execution), and a failed run's error text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from dagster import ExecuteInProcessResult, JobDefinition

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import Declaration, load_declaration, parse_declaration
from poison_pipeline_tests.conftest import SPARK

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def declare(lake: Path, queues: dict[str, Any]) -> Declaration:
    return parse_declaration({"lake_root": str(lake), "spark": SPARK.model_dump(), "queues": queues})


def copy_lake(built: Declaration, tmp_path: Path) -> Declaration:
    """A test's own copy of a lake built once (Delta logs name their files relative to the table)."""
    lake = tmp_path / "lake"
    shutil.copytree(built.lake_root, lake)
    return built.model_copy(update={"lake_root": str(lake)})


def write_config(declaration: Declaration, path: Path) -> Path:
    path.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    return path


def job_of(config: str, name: str) -> JobDefinition:
    """A job of the definitions of a declaration file: the target of build_reconstructable_job."""
    return build_definitions(load_declaration(config)).resolve_job_def(name)


def run_config(op: str, config: dict[str, Any]) -> dict[str, Any]:
    return {**QUIET, "ops": {op: {"config": config}}}


def failure_text(result: ExecuteInProcessResult) -> str:
    """Every error message of a failed run's steps, causes included."""
    texts = []
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data is not None:
            texts.append(event.step_failure_data.error.to_string())
    return "\n".join(texts)
