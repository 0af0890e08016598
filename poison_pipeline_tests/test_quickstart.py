"""README's "Five minutes on your own handler and data", run as written: its declaration, handler,
messages and commands, taken from the README itself, in a folder of their own. The cycles Dagster's
sensors would launch (step 4) are run with the same `run_cycle` its runs call."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RUN_CYCLE = """\
import sys
from poison_pipeline import build_session, load_declaration, run_cycle
declaration = load_declaration("poison_pipeline.yaml")
report = run_cycle(build_session(declaration.spark), declaration, "invoices", sys.argv[1], run_id="quickstart")
print(report.counts)
"""


def quickstart() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.split("## Five minutes on your own handler and data", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def commands(block: str) -> list[list[str]]:
    """The block's `.venv/bin/poison-pipeline` lines as argument lists, comments left out."""
    found = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == ".venv/bin/poison-pipeline":
            found.append([str(BIN / "poison-pipeline"), *words[1:]])
    return found


@pytest.mark.e2e
def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    steps = quickstart()
    declared = yaml.safe_load(blocks(steps, "yaml")[0])["queues"]["invoices"]
    declaration = yaml.safe_load((ROOT / "poison_pipeline.yaml").read_text())
    declaration["queues"]["invoices"] = declared
    (tmp_path / "poison_pipeline.yaml").write_text(yaml.safe_dump(declaration))
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "handlers.py").write_text(blocks(steps, "python")[0])
    (tmp_path / "invoices.jsonl").write_text(blocks(steps, "json")[0])
    # `PYTHONPATH=$PWD`, as step 4 says: the handler's folder is importable where handlers run.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))

    def run(argv: list[str]) -> str:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    enqueue, status = commands(blocks(steps, "bash")[0])
    assert "2" in run(enqueue)
    waiting = run(status)
    assert re.search(r"inbound\s.*\b2\b", waiting), waiting

    # Step 4: the inbound cycle processes inv-1 and moves inv-2 to poison; the poison cycle quarantines it.
    assert "'processed': 1" in run([sys.executable, "-c", RUN_CYCLE, "inbound"])
    assert "'quarantined': 1" in run([sys.executable, "-c", RUN_CYCLE, "poison"])

    groups, history, dry_run, redrive, undo = commands(blocks(steps, "bash")[2])
    assert "InvoiceInvalid" in run(groups)
    assert "inv-2" in run(history)
    assert "would move 1 of 1" in run(dry_run)
    moved = run(redrive)
    assert "moved 1 of 1" in moved
    redrive_id = re.search(r"redrive (redrive-\S+):", moved)
    assert redrive_id, moved
    undone = run([*undo[:-1], redrive_id.group(1)])
    assert f"undid redrive {redrive_id.group(1)}" in undone and "1 message(s) back where they were" in undone
