"""The reference pages cannot drift from the code: every field of the declaration and every command
and option of the command line is documented, and the documented declaration is a valid one."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from poison_pipeline.cli import build_parser
from poison_pipeline.domain.declaration import Declaration, parse_declaration

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DECLARATION_PAGE = DOCS / "reference" / "declaration.md"
CLI_PAGES = [DOCS / "reference" / "cli.md", *sorted((DOCS / "guides" / "operating").glob("*.md"))]


def models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (`Policy`, `dict[str, Queue]`, `Latency | None`, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for argument in typing.get_args(annotation):
        found += models_in(argument)
    if isinstance(annotation, types.UnionType):
        for argument in annotation.__args__:
            found += models_in(argument)
    return found


def field_names(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> dict[str, str]:
    """Every field of `model` and of the models inside it: name -> the model that has it."""
    seen = set() if seen is None else seen
    if model in seen:
        return {}
    seen.add(model)
    names: dict[str, str] = {}
    for name, info in model.model_fields.items():
        names.setdefault(info.alias or name, model.__name__)
        for inner in models_in(info.annotation):
            names.update({k: v for k, v in field_names(inner, seen).items() if k not in names})
    return names


def yaml_keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return {str(k) for k in value} | {k for v in value.values() for k in yaml_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in yaml_keys(v)}
    return set()


def declaration_block() -> str:
    return re.findall(r"```yaml\n(.*?)```", DECLARATION_PAGE.read_text(), flags=re.DOTALL)[0]


def test_the_documented_declaration_is_a_valid_declaration() -> None:
    declaration = parse_declaration(yaml.safe_load(declaration_block()), "declaration.md", import_code=False)
    assert "inventory" in declaration.queues


def test_every_field_of_the_declaration_is_documented() -> None:
    page = DECLARATION_PAGE.read_text()
    documented = yaml_keys(yaml.safe_load(declaration_block())) | set(re.findall(r"`([a-z_]+)", page))
    missing = {name: model for name, model in field_names(Declaration).items() if name not in documented}
    assert not missing, f"fields of the declaration the reference does not name: {missing}"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse offers its subparsers no other way
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_and_option_is_documented() -> None:
    reference = (DOCS / "reference" / "cli.md").read_text()
    pages = "\n".join(page.read_text() for page in CLI_PAGES)
    missing = []
    for name, command in subcommands(build_parser()).items():
        if not re.search(rf"^## {re.escape(name)}$", reference, flags=re.MULTILINE):
            missing.append(f"## {name}")
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in pages:
                    missing.append(f"{name} {option}")
    assert not missing, f"the command-line reference does not document: {missing}"


def test_the_definitions_page_is_what_the_example_declaration_builds() -> None:
    checked = subprocess.run([sys.executable, str(ROOT / "tools" / "definitions_page.py"), "--check"],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_actions_page_lists_every_kind_the_ledger_records_and_which_a_kill_can_leave_half_done():
    from poison_pipeline.operations.actions import KINDS, RESUMABLE

    page = (DOCS / "guides" / "operating" / "actions.md").read_text()
    listed = dict(re.findall(r"^\| `([a-z_]+)` \|.*\| (yes|no)\b", page, flags=re.MULTILINE))
    assert set(listed) == set(KINDS)
    assert {kind for kind, resumable in listed.items() if resumable == "yes"} == set(RESUMABLE)


def test_the_keys_of_history_json_are_each_documented():
    import dataclasses

    from poison_pipeline.operations.history import JourneyEvent

    section = (DOCS / "reference" / "cli.md").read_text().split("## history", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    assert {f.name for f in dataclasses.fields(JourneyEvent)} <= documented
