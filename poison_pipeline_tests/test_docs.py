"""The documentation's code examples and links: README.md and docs/**/*.md.

Every ```python block must compile. A block whose fence has the line `<!-- runs -->` just before it
is also run, as a script of its own, in a temporary folder holding a copy of the repository's
poison_pipeline.yaml (docs/index.md, "Code examples are tests"). Every relative link of a page must
point to a file that exists (`mkdocs build --strict`, run by `make docs` and `make test`, checks the
pages under docs/ as well, anchors included).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNS = "<!-- runs -->"
FENCE = re.compile(r"^```(\w*)\s*$")
# [text](target) and ![alt](target), the text possibly over several lines; an optional "title".
LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    runs: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        runs = i > 0 and lines[i - 1].strip() == RUNS
        found.append(Block(page, i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n", runs))
        i = end + 1
    return found


def prose(page: Path) -> str:
    """The page without its fenced blocks (a link inside a code block is not a link)."""
    kept, inside = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line) or (inside and line.strip() == "```"):
            inside = not inside
            continue
        if not inside:
            kept.append(line)
    return "\n".join(kept)


PYTHON = [block for page in PAGES for block in blocks(page) if block.language == "python"]
RUNNABLE = [block for block in PYTHON if block.runs]


def test_the_pages_have_python_examples_and_some_run() -> None:
    assert len(PYTHON) >= 5
    assert {block.page.name for block in RUNNABLE} >= {"README.md", "declaration.md", "api.md"}


def test_a_runs_mark_always_precedes_a_python_block() -> None:
    """A mark left before anything else would silently run nothing."""
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() == RUNS:
                following = lines[number + 1] if number + 1 < len(lines) else ""
                assert following.startswith("```python"), f"{page.relative_to(ROOT)}:{number + 1}"


@pytest.mark.parametrize("block", PYTHON, ids=lambda block: block.name)
def test_every_python_block_compiles(block: Block) -> None:
    compile(block.code, block.name, "exec")


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.name)
def test_every_runnable_block_runs_beside_the_example_declaration(block: Block, tmp_path: Path) -> None:
    (tmp_path / "poison_pipeline.yaml").write_text((ROOT / "poison_pipeline.yaml").read_text())
    (tmp_path / "example.py").write_text(block.code)
    shown = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, f"{block.name}\n{shown.stdout}\n{shown.stderr}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(page: Path) -> None:
    missing = []
    for target in LINK.findall(prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, or an anchor of the page itself
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_the_readme_links_into_every_docs_section() -> None:
    readme = prose(ROOT / "README.md")
    linked = {target.split("#", 1)[0] for target in LINK.findall(readme)}
    for folder in ("docs/concepts", "docs/guides", "docs/reference"):
        assert any(target.startswith(folder + "/") for target in linked), folder
    assert "docs/index.md" in linked
