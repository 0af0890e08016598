"""The public Python API: what `poison_pipeline` exports, and that importing it costs nothing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import poison_pipeline

INIT = Path(poison_pipeline.__file__)


def test_every_exported_name_resolves_and_nothing_else_is_public() -> None:
    assert dir(poison_pipeline) == poison_pipeline.__all__ == sorted(poison_pipeline.__all__)
    for name in poison_pipeline.__all__:
        assert getattr(poison_pipeline, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = poison_pipeline.nothing_here  # type: ignore[attr-defined]


def test_what_type_checkers_see_is_what_is_exported() -> None:
    """The names imported for type checkers are the exported names (a new export cannot skip them)."""
    tree = ast.parse(INIT.read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If))
    imported = {alias.name for node in guarded.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imported == set(poison_pipeline.__all__)


def test_importing_the_package_imports_neither_dagster_nor_spark() -> None:
    """A Spark worker importing a handler's module, or the command line, pays for what it uses."""
    probe = ("import sys, poison_pipeline, poison_pipeline.domain.envelope; "
             "print(sorted(m for m in ('dagster', 'pyspark', 'deltalake') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"


def test_the_package_says_it_is_typed() -> None:
    assert (INIT.parent / "py.typed").is_file()
