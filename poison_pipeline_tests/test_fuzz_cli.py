"""Fuzzed argument lists for every command, run in-process through the console entry point on a lake
with messages waiting, processed, poisoned and dead-lettered: the exit code is one the help documents,
no traceback is ever shown, and an error names what was wrong."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import example, given

from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline_tests.fuzz_commands import COMMANDS, argv_lists
from poison_pipeline_tests.fuzz_support import COUNTS, fuzz_settings
from poison_pipeline_tests.support import HANDLER
from poison_pipeline_tests.test_fuzz_envelopes import run_cli


def no_spark() -> None:
    raise AssertionError("a cycle of a few messages runs without Spark")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Placeholders of the argument lists and the files they stand for."""
    folder = tmp_path_factory.mktemp("fuzz_cli")
    policy = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0}
    config = folder / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "lake_root": "lake", "lease": {"wait": "2s"},
        "queues": {"q": {"handler": HANDLER, "policy": {**policy, "receive_error_handling": "move"}},
                   "r": {"handler": HANDLER, "policy": {**policy, "receive_error_handling": "reject"}}}}))
    declaration = load_declaration(config)
    for queue in ("q", "r"):
        records = [{"message_id": f"m-{n}", "message_type": "order", "body": {"fail": n > 0},
                    "conversation_id": "c-1", "sequence_number": n} for n in range(3)]
        assert not enqueue(declaration, queue, records).refused
        run_cycle(no_spark, declaration, queue, "inbound")
    if (folder / "lake" / "q" / "poison").exists():
        run_cycle(no_spark, declaration, "q", "poison")
    files = {"IN": b'{"message_id": "new-1", "message_type": "t", "body": {}}\n{"message_id": 5}\n',
             "BODY": b'{"fixed": true}', "IDS": b"m-1\nm-2\n\xff\n", "BAD": b"\xff\xfe\x00{",
             "BADCONFIG": b"queues: [unclosed\n\t- x"}
    paths = {"CONFIG": str(config)}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths[name] = str(folder / name)
    return paths


def _names_something(err: str, argv: list[str], command: str) -> bool:
    """Whether an error line names an argument, a value given, or the option left out."""
    options = set(COMMANDS.get(command, ([], {}))[1]) | {"--config", "command", "COMMAND"}
    told = err.replace("\\\\", "\\")
    return any(token in told for token in [*options, *(a for a in argv if len(a.strip()) >= 2)]) or \
        any(word in told for word in ("declar", "queue", "argument", "required", "invalid choice"))


@fuzz_settings("argv")
@given(argv=argv_lists())
@example(argv=["--config", "CONFIG", "purge", "q", "--table", "poison", "--older-than", "99999999999999999999d"])
@example(argv=["--config", "CONFIG", "maintain", "q", "--retention", "1e400d"])
@example(argv=["--config", "CONFIG", "inspect", "\udcff"])
@example(argv=["--config", "BADCONFIG", "status"])
@example(argv=["--config", "CONFIG", "redrive", "q", "--from", "poison", "--ids", "IDS"])  # not UTF-8
@example(argv=["--config", "CONFIG", "inspect", "m-1", "--table", "poison", "--as-of", "99999999999999999999"])
# The id names a folder: delta-rs could not read a plan under a non-ASCII one (a traceback), and
# "../x" would have left the queue's folder.
@example(argv=["--config", "CONFIG", "edit", "m-1", "--id", "\U000b8683\u00b2", "--body-file", "BODY"])
@example(argv=["--config", "CONFIG", "redrive", "q", "--from", "poison", "--id", "../../x"])
# A rate so slow that the due times overflowed Python's dates (a traceback), or one step of a ramp
# past what a 64-bit count holds.
@example(argv=["--config", "CONFIG", "redrive", "q", "--from", "poison", "--rate", "1e-12/s"])
@example(argv=["--config", "CONFIG", "redrive", "q", "--from", "poison", "--rate", "1e-10/s"])
@example(argv=["--config", "CONFIG", "redrive", "q", "--from", "poison", "--ramp", "1,99999999999999999999999"])
def test_every_argument_list_exits_as_documented_without_a_traceback(lake: dict[str, str], argv: list[str]) -> None:
    argv = [lake.get(token, token) for token in argv]
    code, out, err = run_cli(argv)
    COUNTS["argv lists"] += 1
    COUNTS[f"argv lists exiting {code}"] += 1

    # Python shows a traceback on stderr; stdout may hold a handler's (inspect --stack, --json), never ours.
    assert "Traceback" not in err and "run_console" not in out, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)
    command = next((a for a in argv if a in COMMANDS), "")
    if code == 2:
        assert "error" in err, (argv, err)
        assert _names_something(err, argv, command), (argv, err)
    if code == 0 and ("--help" in argv or "-h" in argv):
        assert "usage:" in out
    if code == 0 and "--json" in argv and "--help" not in argv and "-h" not in argv and out.strip():
        json.loads(out)  # --json output is JSON
