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


def test_the_readme_example_runs_beside_the_example_declaration(tmp_path: Path) -> None:
    readme = (INIT.parent.parent / "README.md").read_text()
    section = readme.split("### The Python API", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "poison_pipeline.yaml").write_text((INIT.parent.parent / "poison_pipeline.yaml").read_text())
    shown = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "accepted 1, refused 0, waiting in orders/inbound: 1"
