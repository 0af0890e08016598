"""The packages depend on each other in one direction only: a reader finds where a rule lives from
the folder names, and a change to the console or the Dagster wiring cannot reach into the engine.

domain (the rules, no I/O) <- storage (tables and files) <- broker, engine (the cycle) <- operations
(the operator console's actions) <- text (what an operator reads of their results) <- cli, defs
(Dagster), runs (the run launcher), examples; views (read only: what a declaration's code and a lake
say) stand on domain and storage, beside the operations."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import poison_pipeline

# What each package may import of the others (top-level modules: `handlers` and `proc`).
ALLOWED = {
    "domain": {"handlers"},
    "storage": {"domain", "handlers", "proc"},
    "broker": {"domain", "storage", "handlers", "proc"},
    "engine": {"domain", "storage", "broker", "handlers", "proc"},
    "operations": {"domain", "storage", "broker", "engine", "handlers", "proc"},
    "views": {"domain", "storage"},
    "text": {"domain", "operations"},
    "cli": {"domain", "storage", "broker", "engine", "operations", "views", "text", "handlers", "proc"},
    "defs": {"domain", "storage", "broker", "engine", "operations", "views", "text", "runs", "handlers", "proc"},
    "runs": {"domain", "storage", "engine", "cli", "handlers", "proc"},
}


def _imports() -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the files that import it."""
    root = Path(poison_pipeline.__file__).parent
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if len(parts) == 1:
            continue
        package = parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                pieces = name.split(".")
                if pieces[0] == "poison_pipeline" and len(pieces) > 1 and pieces[1] != package:
                    found[package][pieces[1]].add(str(path.relative_to(root)))
    return found


def test_each_package_imports_only_the_layers_below_it():
    wrong = {f"{package} -> {imported}": sorted(files)
             for package, targets in _imports().items() if package in ALLOWED
             for imported, files in targets.items() if imported not in ALLOWED[package]}
    assert not wrong, wrong


def test_the_operations_return_data_and_render_nothing():
    root = Path(poison_pipeline.__file__).parent
    rendering = [str(path.relative_to(root)) for package in ("domain", "storage", "broker", "engine", "operations")
                 for path in (root / package).rglob("*.py") if "import rich" in path.read_text()
                 or "from rich" in path.read_text()]
    assert not rendering, rendering


def test_every_package_is_placed_in_a_layer():
    packages = {path.name for path in Path(poison_pipeline.__file__).parent.iterdir()
                if path.is_dir() and (path / "__init__.py").exists()}
    assert packages - set(ALLOWED) == {"examples"}  # examples use every layer, as a user's code does


def test_private_dagster_names_are_used_in_the_run_launchers_package_only_and_still_resolve():
    """Dagster offers no public way to launch runs in a warm process: that package alone reaches into
    `dagster._*`. Every name it takes from there still exists in the installed Dagster."""
    import importlib

    root = Path(poison_pipeline.__file__).parent
    outside, names = [], []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dagster._"):
                if path.relative_to(root).parts[0] != "runs":
                    outside.append(str(path.relative_to(root)))
                names += [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args \
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("dagster._"):
                names.append((node.args[0].value, None))
    assert not outside, outside
    assert len(names) > 5
    for module, name in names:
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name), f"dagster has no {module}.{name} any more"
