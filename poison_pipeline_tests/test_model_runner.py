"""`make model`'s runner (tools/model_long.py): it counts the sequences that ran all their steps,
goes on until the total, resumes from its results file and stops at a failing chunk. The chunks
here are stand-ins for the pytest processes it starts (the model itself is test_model.py's)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CODE = {"product": "p" * 40, "model_tests": "t" * 40, "commit": "abc1234"}


def runner() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "tools" / "model_long.py"
    spec = importlib.util.spec_from_file_location("model_long_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chunks_of(module: ModuleType, monkeypatch: pytest.MonkeyPatch, full: int | None) -> list[int]:
    """Stand-in chunks that run all the sequences they are asked for, but at most `full` of them
    to their last step (None: all)."""
    asked: list[int] = []

    def run_chunk(root: Path, sequences: int, steps: int) -> tuple[bool, str, float]:
        asked.append(sequences)
        ran = sequences if full is None else min(full, sequences)
        return True, (f"fuzz (long profile): {ran} model full-length sequences, {sequences} model sequences, "
                      f"{sequences * steps} model steps\n"), 1.0

    monkeypatch.setattr(module, "code_of", lambda root: dict(CODE))
    monkeypatch.setattr(module, "run_chunk", run_chunk)
    return asked


def lines(results: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in results.read_text().splitlines()]


def test_only_sequences_that_ran_all_their_steps_count_and_chunks_go_on_to_the_total(tmp_path, monkeypatch,
                                                                                      capsys):
    module = runner()
    asked = chunks_of(module, monkeypatch, full=20)
    results = tmp_path / "model_long.jsonl"
    assert module.main(["--workers", "2", "--sequences", "50", "--chunk", "25", "--results", str(results)]) == 0
    assert sum(line["sequences"] for line in lines(results)) == 50
    assert sum(asked) > 50  # 20 of each 25 counted: more chunks than 50 / 25
    assert "50 full-length sequences, 0 failed" in capsys.readouterr().out


def test_a_stopped_run_resumes_from_its_results_and_runs_no_more_than_the_total(tmp_path, monkeypatch):
    module = runner()
    asked = chunks_of(module, monkeypatch, full=None)
    results = tmp_path / "model_long.jsonl"
    assert module.main(["--workers", "1", "--sequences", "30", "--chunk", "25", "--results", str(results)]) == 0
    assert asked == [25, 5]
    assert module.main(["--workers", "1", "--sequences", "40", "--chunk", "25", "--results", str(results)]) == 0
    assert asked == [25, 5, 10]  # the 30 recorded count; only the rest runs


def test_a_chunk_without_a_full_length_sequence_fails_the_run(tmp_path, monkeypatch):
    """Such a chunk would count for nothing and be asked again for ever: it stops the run, kept as a
    failed line, and a later run on the same code refuses to go on."""
    module = runner()
    asked = chunks_of(module, monkeypatch, full=0)
    results = tmp_path / "model_long.jsonl"
    assert module.main(["--workers", "1", "--sequences", "50", "--results", str(results)]) == 1
    assert asked == [25]
    assert [line["passed"] for line in lines(results)] == [False]
    assert module.main(["--workers", "1", "--sequences", "50", "--results", str(results)]) == 1
    assert asked == [25]
