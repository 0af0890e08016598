"""The `poison-pipeline` command run as operators run it, one process per command: it exits with its
documented code and prints its answer every time, not most times (issue 7, item 5: a command that
had read a table aborted after printing its answer, exit code 134, in up to 26 of 40 runs)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from poison_pipeline.cli import flush_output, main
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.test_cli import write_config, write_jsonl

pytestmark = pytest.mark.e2e

AT_ONCE = 2  # commands running at a time (each one's runs stay in a row)
REPO = Path(__file__).resolve().parents[1]
COMMAND = Path(sys.executable).with_name("poison-pipeline")
INBOX = "inbox/poison_pipeline.yaml"


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    code: int
    says: str  # on stdout when the code is 0, on stderr otherwise


# Each command's runs cycle through its cases: the answer, and where it has one, the refusal.
COMMANDS: dict[str, list[Run]] = {
    # Into a lake of its own (a --config after the command wins): what the others read stays the same.
    "enqueue": [Run(("enqueue", "one.jsonl", "--queue", "q", "--config", INBOX), 0, "enqueued 1 of 1 messages"),
                Run(("enqueue", "mixed.jsonl", "--queue", "q", "--config", INBOX), 1, "line 2: not valid JSON")],
    "status": [Run(("status",), 0, "conversation_ended=1 rejected=2"),
               Run(("status", "--json"), 0, '"checked_at"'),
               Run(("status", "--queue", "nope"), 2, "no queue 'nope' is declared")],
    "inspect": [Run(("inspect", "bad-1"), 0, "ValueError: message bad-1 always fails"),
                Run(("inspect", "bin-1", "--json"), 0, '"raw_body": "3q2+7w=="'),
                Run(("inspect", "ghost"), 1, "message 'ghost' is in no table")],
    "enable": [Run(("enable", "q", "--actor", "test"), 0, "already enabled; its state is unchanged"),
               Run(("enable", "nope"), 2, "no queue 'nope' is declared")],
    "end-conversation": [
        Run(("end-conversation", "c-1", "--code", "42", "--description", "part obsolete", "--queue", "q",
             "--actor", "test"), 0, "already ended"),
        Run(("end-conversation", "nobody", "--code", "42", "--description", "x"), 1, "has no messages"),
    ],
}


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A declaration whose tables every command reads data files of: attempts, a dead-letter
    table mixing two reasons, enable and disable events, an ended conversation."""
    folder = tmp_path_factory.mktemp("cli_exit")
    config = write_config(folder)
    cli = ["--config", str(config)]
    write_jsonl(
        folder / "in.jsonl",
        {"message_id": "ok-1", "message_type": "order", "body": {"n": 1}},
        {"message_id": "bad-1", "message_type": "order", "body": {"fail": True}},
        {"message_id": "bin-1", "message_type": "blob", "encoding": "binary", "body_base64": "3q2+7w=="},
    )
    assert main([*cli, "enqueue", str(folder / "in.jsonl"), "--queue", "q"]) == 0
    run_cycle(spark, load_declaration(config), "q", "inbound")
    set_enabled(QueueTables.of(load_declaration(config), "q"), False, "test", "schema change")
    assert main([*cli, "enable", "q", "--actor", "test"]) == 0
    write_jsonl(folder / "c-1.jsonl", {"message_id": "c-1-1", "message_type": "order", "body": {},
                                       "conversation_id": "c-1"})
    assert main([*cli, "enqueue", str(folder / "c-1.jsonl"), "--queue", "q"]) == 0
    assert main([*cli, *COMMANDS["end-conversation"][0].args]) == 0
    (folder / "inbox").mkdir()
    write_config(folder / "inbox")
    write_jsonl(folder / "one.jsonl", {"message_id": "late-1", "message_type": "order", "body": {}})
    write_jsonl(folder / "mixed.jsonl", {"message_id": "late-2", "message_type": "order", "body": {}}, "{not json")
    return config


def _run(config: Path, program: list[str], run: Run) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([*program, "--config", str(config), *run.args], cwd=config.parent, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _problem(run: Run, done: subprocess.CompletedProcess[str]) -> str | None:
    said = done.stdout if run.code == 0 else done.stderr
    if done.returncode == run.code and run.says in said:
        return None
    return (f"{' '.join(run.args)}: exit code {done.returncode} (documented {run.code}); "
            f"stderr ends {done.stderr[-300:]!r}; stdout ends {done.stdout[-300:]!r}")


def _in_a_row(config: Path, command: str, times: int) -> tuple[Counter[int], list[str]]:
    runs = COMMANDS[command]
    codes: Counter[int] = Counter()
    problems: list[str] = []
    for number in range(times):
        run = runs[number % len(runs)]
        done = _run(config, [str(COMMAND)], run)
        codes[done.returncode] += 1
        if (problem := _problem(run, done)) is not None:
            problems.append(f"run {number + 1}: {problem}")
    return codes, problems


def test_arrow_releasing_what_was_read_late_does_not_abort_the_command(lake: Path) -> None:
    """Made certain with `late_release`: Arrow's worker is still releasing buffers it read when the
    command has printed its answer (on a busy machine this happens by itself, now and then)."""
    probe = [sys.executable, "-m", "poison_pipeline_tests.late_release"]
    # The probe shows something only where a plain Python exit aborts (SIGABRT) after a late release.
    if not any(_run(lake, [*probe, "--finalize"], COMMANDS["inspect"][0]).returncode == -6 for _ in range(3)):
        pytest.skip("a plain Python exit no longer aborts after a late release by Arrow")
    runs = [COMMANDS[command][0] for command in ("status", "inspect", "enable", "end-conversation")] * 2
    problems = [problem for run in runs if (problem := _problem(run, _run(lake, probe, run))) is not None]
    assert not problems


# `make test` runs each command 10 times in a row, `make test-all` 50 times too: an exit code that goes
# wrong now and then (a late release by Arrow, above) shows only over many runs.
@pytest.mark.parametrize("runs", [10, pytest.param(50, marks=pytest.mark.full)])
def test_every_command_exits_with_its_documented_code_every_time_in_a_row(lake: Path, runs: int) -> None:
    assert COMMAND.exists(), f"{COMMAND} is not installed (make .venv/.installed-stamp)"
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        results = dict(zip(COMMANDS, pool.map(lambda command: _in_a_row(lake, command, runs), COMMANDS),
                           strict=True))
    failed = {command: (dict(codes), problems[:3]) for command, (codes, problems) in results.items() if problems}
    assert not failed, f"exit codes per command, and the first problems: {failed}"



class _Unwritable(io.StringIO):
    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def flush(self) -> None:
        raise self.error


@pytest.mark.parametrize(("error", "told"), [
    (BrokenPipeError(32, "Broken pipe"), ""),
    (OSError(28, "No space left on device"), "poison-pipeline: error: could not write the output: "
                                              "[Errno 28] No space left on device\n"),
])
def test_output_that_cannot_be_written_makes_success_exit_1(
    error: OSError, told: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(sys, "stdout", _Unwritable(error))
    assert (flush_output(0), flush_output(2)) == (1, 2)
    assert stderr.getvalue() == told * 2
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert flush_output(0) == 0
