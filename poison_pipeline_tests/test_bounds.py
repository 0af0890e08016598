"""Bounds at the door (issue 43): a rate, an age, a count, a version or a ramp step whose arithmetic
would overflow or reach absurd dates is refused with exit code 2 and one line naming the argument
and its bound, from the command line and the Python API alike, and nothing in the lake changes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from poison_pipeline.domain.bounds import LARGEST_COUNT, SLOWEST_RATE, bounded_count, bounded_rate, spread_problem
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.domain.durations import LONGEST
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import RedriveError, RedriveRequest, redrive, redrive_table
from poison_pipeline_tests.support import HANDLER, rows
from poison_pipeline_tests.test_fuzz_envelopes import run_cli

TOO_BIG = str(LARGEST_COUNT + 1)


def _no_spark() -> None:
    raise AssertionError("a cycle of a few messages runs without Spark")


@pytest.fixture
def lake(tmp_path: Path) -> tuple[Path, Declaration]:
    """Queue q with 3 messages in poison."""
    config = tmp_path / "poison_pipeline.yaml"
    policy = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
              "receive_error_handling": "move"}
    config.write_text(yaml.safe_dump({"lake_root": "lake", "lease": {"wait": "2s"},
                                      "queues": {"q": {"handler": HANDLER, "policy": policy}}}))
    declaration = load_declaration(config)
    records = [{"message_id": f"m-{n}", "message_type": "order", "body": {"fail": True}} for n in range(3)]
    assert not enqueue(declaration, "q", records).refused
    run_cycle(_no_spark, declaration, "q", "inbound")
    assert len(rows(declaration, "poison")) == 3
    return config, declaration


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_the_bounds_themselves() -> None:
    assert bounded_count(LARGEST_COUNT) == LARGEST_COUNT and bounded_rate(SLOWEST_RATE) == SLOWEST_RATE
    for wrong in (-1, LARGEST_COUNT + 1):
        with pytest.raises(ValueError, match="from 0 to 9223372036854775807"):
            bounded_count(wrong)
    for wrong in (0.0, -1.0, float("inf"), float("nan"), 1e-12, SLOWEST_RATE / 2):
        with pytest.raises(ValueError, match="messages per second"):
            bounded_rate(wrong)
    # The last of `count` messages is due at most LONGEST from now; the suggested rate fits.
    assert spread_problem(1, SLOWEST_RATE) is None and spread_problem(2, SLOWEST_RATE) is None
    said = spread_problem(100, 1e-9)
    assert said is not None and "at least 3.14e-09/s" in said
    assert spread_problem(100, 3.14e-9) is None and spread_problem(100, 3.13e-9) is not None


@pytest.mark.parametrize("argv, said", [
    # The rate of the reproduction: the due times overflowed Python's dates (a traceback, exit 1).
    (["redrive", "q", "--from", "poison", "--rate", "1e-12/s"], "--rate 1e-12: give at least 3.18e-11 messages "
                                                                 "per second: one per 365000 days"),
    # Slow enough that 3 messages would be spread over more than the longest duration.
    (["redrive", "q", "--from", "poison", "--rate", "3.2e-11/s"], "--rate 3.2e-11/s would release 3 messages over "
                                                                   "more than 365000 days"),
    (["redrive", "q", "--from", "poison", "--rate", "3.2e-11/s", "--dry-run"], "would release 3 messages"),
    (["redrive", "q", "--from", "poison", "--rate", "3.2e-11/s", "--limit", "5"], "would release 5 messages"),
    (["redrive", "q", "--from", "poison", "--limit", TOO_BIG], f"--limit {TOO_BIG}: give a whole number from 1 to "
                                                               "9223372036854775807"),
    (["redrive", "q", "--from", "poison", "--ramp", f"1,{TOO_BIG}"], f"step {TOO_BIG}: give a whole number"),
    (["redrive", "q", "--from", "poison", "--ramp", "1,all", "--max-failures", TOO_BIG], "--max-failures"),
    (["redrive", "q", "--from", "poison", "--as-of-version", TOO_BIG], f"--as-of-version {TOO_BIG}: give a whole"),
    (["redrive", "q", "--from", "poison", "--group", f"abcd1234@{TOO_BIG}"], f"version {TOO_BIG}: give a whole"),
    (["purge", "q", "--table", "poison", "--older-than", "365001d", "--yes"], "--older-than '365001d' is longer "
                                                                               "than 365000 days"),
    (["purge", "q", "--table", "poison", "--older-than", "30d", "--as-of-version", TOO_BIG], "--as-of-version"),
    (["maintain", "q", "--retention", "365001d"], "is longer than 365000 days"),
])
def test_an_argument_past_its_bound_is_refused_naming_it_and_changes_nothing(
        lake: tuple[Path, Declaration], argv: list[str], said: str) -> None:
    config, _ = lake
    before = _files(config.parent / "lake")
    code, out, err = run_cli(["--config", str(config), *argv])
    assert code == 2, (out, err)
    assert said in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 or err.startswith("usage:"), err
    assert _files(config.parent / "lake") == before


def test_the_python_api_refuses_the_same_before_writing(lake: tuple[Path, Declaration]) -> None:
    config, declaration = lake
    before = _files(config.parent / "lake")
    with pytest.raises(ValidationError, match="give at least 3.18e-11 messages per second"):
        RedriveRequest(queue="q", source_tables=["poison"], rate=1e-12)
    with pytest.raises(RedriveError, match="would release 3 messages over more than 365000 days"):
        redrive(declaration, RedriveRequest(queue="q", source_tables=["poison"], rate=3.2e-11))
    for rate, said in ((1e-12, "give at least"), (3.2e-11, "would release 3 messages")):
        with pytest.raises(RedriveError, match=said):
            redrive_table(declaration, "q", "poison", rate=rate)
    assert _files(config.parent / "lake") == before


def test_a_rate_within_the_bound_dates_its_messages_within_the_longest_duration(lake: tuple[Path, Declaration]) -> None:
    _, declaration = lake
    now = datetime.now(UTC)
    result = redrive_table(declaration, "q", "poison", rate=1e-9, now=now)
    assert result.moved == 3
    due = sorted(r["due_at"] for r in rows(declaration, "inbound"))
    assert now <= due[0] and due[-1] - now <= LONGEST
