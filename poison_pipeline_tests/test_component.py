"""The declared queues as a Dagster component: built from attributes in Python, and in a fresh `dg`
project (scaffolded, checked and listed by the real `dg` command line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from poison_pipeline import PoisonQueuesComponent
from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import DeclarationError, parse_declaration

QUEUES = {"orders": {"handler": "poison_pipeline_tests.handlers:accept"}}
DG = str(Path(sys.executable).with_name("dg"))
PROJECT_TOML = """\
[project]
name = "shop"
version = "0.1.0"
requires-python = ">=3.11"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "shop"
"""
DEFINITIONS_PY = """\
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""


# The lake root the project's component reads, as its definitions load.
LAKE_ROOT_OF = """\
from pathlib import Path
from dagster.components.core.component_tree import ComponentTree
from poison_pipeline import PoisonQueuesComponent
tree = ComponentTree.for_project(Path.cwd())
print(next(iter(tree.get_all_components(of_type=PoisonQueuesComponent))).declaration.lake_root)
"""


def names(defs: dg.Definitions) -> dict[str, set[str]]:
    repository = defs.get_repository_def()
    return {
        "assets": {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()},
        "checks": {key.to_user_string() for key in repository.asset_graph.asset_check_keys},
        "jobs": {job.name for job in repository.get_all_jobs() if not job.name.startswith("__")},
        "sensors": {sensor.name for sensor in repository.sensor_defs},
        "schedules": {schedule.name for schedule in repository.schedule_defs},
    }


def test_the_component_builds_what_the_declaration_builds(tmp_path: Path) -> None:
    attributes = {"lake_root": str(tmp_path / "lake"), "queues": QUEUES}
    component = PoisonQueuesComponent.from_attributes_dict(attributes=attributes)
    built = names(component.build_defs(dg.ComponentTree.for_test().load_context))
    assert built == names(build_definitions(parse_declaration(attributes)))
    assert {"orders/inbound", "orders/poison", "orders/dead_letter"} <= built["assets"]
    assert "orders__inbound_sensor" in built["sensors"]


@pytest.mark.parametrize(("change", "named"), [
    ({"hook_timeout": "soon"}, "'soon' is not a duration"),
    ({"queues": {"orders": {**QUEUES["orders"], "poison_queue": {"handler": "nowhere_at_all:handle"}}}},
     "nowhere_at_all"),
    ({"queues": {"orders": {**QUEUES["orders"], "colour": "red"}}}, "colour"),
])
def test_bad_attributes_are_refused_naming_what_the_command_line_names(tmp_path: Path, change: dict[str, Any],
                                                                      named: str) -> None:
    attributes = {"lake_root": str(tmp_path / "lake"), "queues": QUEUES, **change}
    with pytest.raises(DeclarationError) as by_command_line:
        parse_declaration(attributes)
    assert named in str(by_command_line.value)
    with pytest.raises(Exception) as by_component:  # noqa: B017 - Dagster wraps pydantic's error its own way
        PoisonQueuesComponent.from_attributes_dict(attributes=attributes)
    assert named in str(by_component.value)


def dg_env(project: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(project / "src"), str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH"))
        if p))


def dg_command(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DG, *args], cwd=project, env={**dg_env(project), **(env or {})}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.e2e
def test_a_fresh_dg_project_scaffolds_checks_and_lists_the_queues(tmp_path: Path) -> None:
    project = tmp_path / "shop"
    (project / "src" / "shop" / "defs").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PROJECT_TOML)
    (project / "src" / "shop" / "__init__.py").write_text("")
    (project / "src" / "shop" / "defs" / "__init__.py").write_text("")
    (project / "src" / "shop" / "definitions.py").write_text(DEFINITIONS_PY)

    listed = dg_command(project, "list", "components", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "poison_pipeline.PoisonQueuesComponent" in {c["key"] for c in json.loads(listed.stdout)["items"]}

    scaffolded = dg_command(project, "scaffold", "defs", "poison_pipeline.PoisonQueuesComponent", "queues")
    assert scaffolded.returncode == 0, scaffolded.stderr
    defs_yaml = project / "src" / "shop" / "defs" / "queues" / "defs.yaml"
    written = yaml.safe_load(defs_yaml.read_text())
    assert written["type"] == "poison_pipeline.PoisonQueuesComponent"
    assert dg_command(project, "check", "yaml").returncode == 0

    shown = dg_command(project, "list", "defs", "--json")
    assert shown.returncode == 0, shown.stderr
    listed_defs = json.loads(shown.stdout)
    # The same definitions as the declaration gives `dagster dev`, its relative lake in the project's folder.
    declaration = parse_declaration(written["attributes"], base_dir=project)
    expected = names(build_definitions(declaration))
    assert {a["asset_key"] for a in listed_defs["assets"]} == expected["assets"]
    assert {j["name"] for j in listed_defs["jobs"]} == expected["jobs"]
    assert {s["name"] for s in listed_defs["sensors"]} == expected["sensors"]
    assert {s["name"] for s in listed_defs["schedules"]} == expected["schedules"]
    assert len(listed_defs["asset_checks"]) == len(expected["checks"])
    assert declaration.lake_root == str(project / "lake")

    # A value the schema refuses: `dg check yaml` names the field and the line, and exits non-zero.
    policy = written["attributes"]["queues"]["orders"]["policy"]
    policy["receive_retry_count"] = -1
    defs_yaml.write_text(yaml.safe_dump(written))
    refused = dg_command(project, "check", "yaml")
    assert refused.returncode != 0
    assert "attributes.queues.orders.policy.receive_retry_count" in refused.stdout + refused.stderr
    # A rule the schema cannot say (a duration's spelling): refused when the definitions load.
    policy["receive_retry_count"] = 1
    policy["retry_cycle_delay"] = "soon"
    defs_yaml.write_text(yaml.safe_dump(written))
    refused = dg_command(project, "list", "defs", "--json")
    assert refused.returncode != 0
    assert "'soon' is not a duration" in refused.stdout + refused.stderr

    # Templates are rendered before the declaration is read.
    policy["retry_cycle_delay"] = "30m"
    written["attributes"]["lake_root"] = "{{ env.SHOP_LAKE }}"
    written["requirements"] = {"env": ["SHOP_LAKE"]}
    defs_yaml.write_text(yaml.safe_dump(written))
    read = dg_command(project, "list", "defs", "--json", env={"SHOP_LAKE": str(tmp_path / "elsewhere")})
    assert read.returncode == 0, read.stderr
    loaded = subprocess.run([sys.executable, "-c", LAKE_ROOT_OF], cwd=project, capture_output=True, text=True,
                            env={**dg_env(project), "SHOP_LAKE": str(tmp_path / "elsewhere")}, timeout=300)
    assert loaded.stdout.strip().splitlines()[-1] == str(tmp_path / "elsewhere"), loaded.stderr
    # Unset, the variable is named, not read as a null lake_root.
    unset = subprocess.run([sys.executable, "-c", LAKE_ROOT_OF], cwd=project, capture_output=True, text=True,
                           env={k: v for k, v in dg_env(project).items() if k != "SHOP_LAKE"}, timeout=300)
    assert unset.returncode != 0
    assert ("attributes.lake_root = '{{ env.SHOP_LAKE }}': the environment variable SHOP_LAKE is not set"
            in unset.stderr), unset.stderr
