"""`poison-pipeline check`: a declaration validated as running its queues needs it (every handler,
hook and exception type imported), each problem on a line of its own that starts with the file and
the line it is about, as a compiler says it (`poison_pipeline.yaml:12: queues.orders.handler: ...`).

The problems are the declaration's own errors (parse_declaration's words), or, for a declaration
that is valid as written, the user code that does not import (views/user_code.py's words). A
problem's line is that of the deepest field of its path the YAML spells; a missing field points at
the section it is missing from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from poison_pipeline.domain.declaration import (
    Declaration,
    DeclarationError,
    declaration_path,
    field_path,
    load_declaration,
)
from poison_pipeline.views.user_code import code_problems, declaration_code_problem

__all__ = ["DeclarationCheck", "check_declaration", "located_error"]


@dataclass(frozen=True)
class DeclarationCheck:
    path: Path
    # The declaration as read (its code not imported), None when it is invalid as written.
    declaration: Declaration | None
    # One line each: "<path>:<line>: <field path>: <what is wrong>" (no line when the file has none).
    problems: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.problems


def check_declaration(path: str | os.PathLike[str] | None = None) -> DeclarationCheck:
    """Check the declaration `path` names (as load_declaration finds it), importing its code."""
    chosen = declaration_path(path)
    try:
        declaration = load_declaration(chosen, import_code=False)
    except DeclarationError as error:
        said = str(error).splitlines()
        # parse_declaration's first line names the file; the lines after it are one error each.
        errors = [line.strip() for line in said[1:]] or said
        return DeclarationCheck(chosen, None, tuple(_located(chosen, errors)))
    found = [line for problem in code_problems(declaration).values() for line in problem.lines]
    hook = declaration_code_problem(declaration)
    return DeclarationCheck(chosen, declaration, tuple(_located(chosen, found + ([hook] if hook else []))))


def located_error(path: str | os.PathLike[str] | None, error: DeclarationError) -> DeclarationError:
    """`error` (parse_declaration's: a first line naming the file, then one error each) with each
    error's file and line in front, as `check` prints them."""
    said = str(error).splitlines()
    if len(said) < 2:
        return error
    chosen = declaration_path(path)
    return DeclarationError("\n".join([said[0], *(f"  {line}" for line in _located(
        chosen, [line.strip() for line in said[1:]]))]))


def _located(path: Path, errors: list[str]) -> list[str]:
    lines = _field_lines(path)
    located = []
    for error in errors:
        # The longest field path the error starts with: its own field, else the section it belongs to.
        known = [name for name in lines if error.startswith((f"{name} ", f"{name}.", f"{name}:"))]
        line = lines[max(known, key=len)] if known else None
        located.append(f"{path}:{line}: {error}" if line else f"{path}: {error}")
    return located


def _field_lines(path: Path) -> dict[str, int]:
    """Every field path the YAML spells (as errors name them), with the line of its key (1-based)."""
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    found: dict[str, int] = {}

    def walk(node: yaml.Node, loc: tuple[int | str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    found[field_path((*loc, key.value))] = key.start_mark.line + 1
                    walk(value, (*loc, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                found[field_path((*loc, index))] = item.start_mark.line + 1
                walk(item, (*loc, index))

    if root is not None:
        walk(root, ())
    return found
