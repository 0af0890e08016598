"""Fuzzed JSON Lines through enqueue (the Python API and the `enqueue` command): nothing crashes, every
refusal names the field and the rule, accepted + refused = lines, nothing is enqueued twice or lost,
and the vectorised path reads every line it takes exactly as `parse_envelope` does."""

from __future__ import annotations

import io
import json
import math
import sys
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from poison_pipeline.cli import run_console
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.domain.envelope import FIELDS, parse_envelope, shown
from poison_pipeline.operations.enqueue import enqueue_data, refused_path
from poison_pipeline.operations.jsonl import screen
from poison_pipeline.operations.records import Parsed, enqueue, envelope_table, land, parse_texts
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.fuzz_support import COUNTS, LINE_LEVEL, MAX_BODY, TTL, Line, batches, fuzz_settings
from poison_pipeline_tests.support import HANDLER

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)
SPEC = {"handler": HANDLER, "policy": {"time_to_live": f"{int(TTL.total_seconds())}s", "max_body_bytes": MAX_BODY}}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Declaration, Path]:
    folder = tmp_path_factory.mktemp("fuzz_envelopes")
    config = folder / "poison_pipeline.yaml"
    # q: the file path; r: the same lines one by one; c: the command; o: decoded objects.
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {name: SPEC for name in "qrco"}}))
    return load_declaration(config), config


def _prefix_of(error: str) -> str | None:
    """The field (or the line-level rule) a refusal starts with, or None: a refusal naming nothing."""
    for level in LINE_LEVEL:
        if error.startswith(level):
            return "line"
    field, sep, rule = error.partition(": ")
    return field if sep and rule.strip() else None


def _unknown_name(key: str) -> str:
    return key if key.isprintable() and key else shown(key)


def check_outcome(batch: list[Line], refused: dict[int, str], landed_ids: list[str]) -> int:
    """Check each line's fate against what it was generated to be; returns how many were accepted."""
    claimed: set[str] = set()
    for number, line in enumerate(batch, start=1):
        error = refused.get(number)
        assert error is None or _prefix_of(error) is not None, f"line {number}: refusal names nothing: {error!r}"
        if error is not None and _prefix_of(error) != "line":
            assert _prefix_of(error) in FIELDS or line.verdict not in ("valid", "any", "line"), error
        if line.verdict == "valid":
            if line.message_id in claimed:
                assert error == f"message_id: {line.message_id!r} appears twice in this batch", (line, error)
            else:
                assert error is None, (line, error)
                claimed.add(line.message_id)
        elif line.verdict == "line":
            assert error is not None and _prefix_of(error) == "line", (line, error)
        elif line.verdict == "any":
            if error is None:
                claimed.add(json.loads(line.raw)["message_id"])
        else:
            assert error is not None, f"line {number} breaks {line.verdict} but was accepted: {line.raw[:300]!r}"
            named = line.verdict if line.verdict in FIELDS else _unknown_name(line.verdict)
            assert error.startswith(f"{named}: "), (line.verdict, error)
    assert sorted(landed_ids) == sorted(claimed), "what landed is not what was accepted"
    assert len(set(landed_ids)) == len(landed_ids), "an id landed twice"
    return len(claimed)


def _batch_rows(declaration: Declaration, queue: str, batch_id: str | None) -> list[dict[str, Any]]:
    if batch_id is None:
        return []
    dataset = QueueTables.of(declaration, queue).open("inbound").to_pyarrow_dataset()
    table = dataset.to_table(filter=pc.field("batch_id") == batch_id)
    return sorted(({k: v for k, v in row.items() if k != "batch_id"} for row in table.to_pylist()),
                  key=lambda row: row["message_id"])


def _data(batch: list[Line]) -> bytes:
    return b"\n".join(line.raw for line in batch) + b"\n"


_DEEP = Line(b'{"message_id":"deep","message_type":"t","body":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "line")


@fuzz_settings("envelopes")
@given(batch=batches())
# pyarrow's JSON reader crashed the process on this line (a stack overflow, not an exception).
@example(batch=[_DEEP])
@example(batch=[Line(b'{"message_id":"a\\ud800","message_type":"t"}', "message_id")])
@example(batch=[Line(b'{"message_id":"y","message_type":"t","enqueued_at":"0001-01-01T00:00:00+01:00"}',
                     "enqueued_at")])
@example(batch=[Line(b'{"message_id":"e","message_type":"t","encoding":0}', "encoding"),
                Line(b'{"message_id":"h","message_type":"t","headers":[]}', "headers")])
@example(batch=[Line(b'{"message_id":"n","message_type":"t","body":{"x":1e400}}', "body"),
                Line(b'{"message_id":"i","message_type":"t","body":{"x":' + b"9" * 5000 + b"}}", "line")])
def test_enqueue_accepts_or_refuses_every_line_naming_the_field(lake, batch: list[Line]) -> None:
    declaration, _ = lake
    data = _data(batch)
    result = enqueue_data(declaration, "q", data, now=NOW)
    COUNTS["envelopes"] += len(batch)

    assert result.lines == len(batch) == result.accepted + len(result.refused)
    refused = {r.line.number: r.error for r in result.refused}
    assert len(refused) == len(result.refused), "a line refused twice"
    landed = _batch_rows(declaration, "q", result.batch_id)
    assert check_outcome(batch, refused, [row["message_id"] for row in landed]) == result.accepted
    bodies = {line.message_id: line.body for number, line in reversed(list(enumerate(batch, start=1)))
              if line.verdict == "valid" and number not in refused}
    for row in landed:
        if row["message_id"] in bodies:
            assert row["body"] == bodies[row["message_id"]], row["message_id"]

    # The per-record path alone lands and refuses exactly the same.
    others, screened = [], []
    for number, line in enumerate(batch, start=1):
        text, problem = screen(line.raw)
        (others.append((number, text)) if text is not None else screened.append((number, None, problem)))
    baseline = land(declaration, "r", Parsed.none(), others, lambda n: "", NOW)
    assert [(r.line.number, r.message_id, r.error) for r in result.refused] == sorted(
        screened + [(r.line, r.message_id, r.error) for r in baseline.refused])
    assert landed == _batch_rows(declaration, "r", baseline.batch_id)

    # Every line the vectorised path reads, parse_envelope reads the same.
    raws = pa.array([line.raw for line in batch], pa.large_binary())
    parsed, _ = parse_texts(raws, np.arange(1, len(batch) + 1), declaration.queue("q").policy, NOW)
    COUNTS["envelopes_vectorised"] += len(parsed.lines)
    expected = [parse_envelope(json.loads(batch[n - 1].raw), NOW, TTL, MAX_BODY) for n in parsed.lines.tolist()]
    assert parsed.envelopes.to_pylist() == envelope_table(expected).to_pylist()


def run_cli(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    """The console entry point in-process, its output as a terminal would get it: stdout strict
    UTF-8 (a lone surrogate there fails as it would), stderr with backslash escapes (Python's)."""
    out, err = io.BytesIO(), io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", errors="strict", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    saved_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            code = run_console(argv)
    finally:
        sys.stdin = saved_stdin
    return code, out.getvalue().decode("utf-8", "replace"), err.getvalue().decode("utf-8", "replace")


@fuzz_settings("cli_enqueue")
@given(batch=batches(drawn=40, bulk=100))
def test_the_enqueue_command_reports_every_refused_line_and_keeps_it(lake, tmp_path_factory, batch) -> None:
    declaration, config = lake
    source = tmp_path_factory.mktemp("cli_enqueue") / "in.jsonl"
    source.write_bytes(_data(batch))
    code, out, err = run_cli(["--config", str(config), "enqueue", str(source), "--queue", "c"])
    COUNTS["envelopes"] += len(batch)

    assert "Traceback" not in out + err
    said = [line for line in err.splitlines() if line.startswith(f"{source}: line ")]
    refused = {int(line.split(": line ", 1)[1].split(":", 1)[0]): line for line in said}
    assert code == (1 if refused else 0), err
    accepted = int(out.split("enqueued ", 1)[1].split(" of ", 1)[0])
    assert f"enqueued {accepted} of {len(batch)} messages into queue 'c'" in out
    assert accepted + len(refused) == len(batch)
    for number, text in refused.items():  # the field (or the line's rule) is on the line
        verdict = batch[number - 1].verdict
        if verdict not in ("valid", "line", "any"):
            named = verdict if verdict in FIELDS else _unknown_name(verdict)
            assert f"{named}: " in text, text
    batch_id = out.split("(batch ", 1)[1].split(")", 1)[0] if "(batch " in out else None
    landed = [row["message_id"] for row in _batch_rows(declaration, "c", batch_id)]
    assert len(landed) == len(set(landed)) == accepted
    if refused:
        kept = refused_path(source).read_bytes()
        assert kept == b"".join(batch[n - 1].raw.rstrip(b"\r") + b"\n" for n in sorted(refused))


_PYTHON_ODDITIES: list[Any] = [
    {"message_id": "set", "message_type": "t", "body": {1, 2}},
    {"message_id": "bytes", "message_type": "t", "body": b"\x00\xff"},
    {"message_id": "nan", "message_type": "t", "body": {"x": math.nan}},
    {"message_id": "huge", "message_type": "t", "body": {"x": 10**5000}},
    {"message_id": 10**5000, "message_type": "t"},
    {"message_id": "seq", "message_type": "t", "conversation_id": "c", "sequence_number": 10**5000},
    {"message_id": "keys", "message_type": "t", "body": {(1, 2): "tuple key"}},
    {1: "int key", "message_id": "ik", "message_type": "t"},
    {"message_id": "when", "message_type": "t", "enqueued_at": datetime(1, 1, 1)},
    {"message_id": "obj", "message_type": "t", "sender": object()},
    {"message_id": "a\ud800", "message_type": "t"},
    '{"message_id": "raw\ud800", "message_type": "t"}',
    None, 5, [], "",
]


@fuzz_settings("objects")
@given(batch=batches(drawn=40, bulk=100), oddities=st.lists(st.sampled_from(_PYTHON_ODDITIES)))
def test_the_python_api_takes_decoded_objects_and_odd_values_without_crashing(lake, batch, oddities) -> None:
    declaration, _ = lake
    records: list[Any] = []
    for line in batch:
        try:
            records.append(json.loads(line.raw))
        except (ValueError, RecursionError):  # not JSON (or not UTF-8): given as text, bad bytes as surrogates
            records.append(line.raw.decode("utf-8", "surrogateescape"))
    records += oddities
    result = enqueue(declaration, "o", records, now=NOW)
    COUNTS["envelopes"] += len(records)

    assert result.accepted + len(result.refused) == len(records)
    for refusal in result.refused:
        assert _prefix_of(refusal.error) is not None, refusal
    landed = [row["message_id"] for row in _batch_rows(declaration, "o", result.batch_id)]
    assert len(landed) == len(set(landed)) == result.accepted
    for number, line in enumerate(batch, start=1):
        if line.verdict not in ("valid", "line", "any"):
            error = next(r.error for r in result.refused if r.line == number)
            named = line.verdict if line.verdict in FIELDS else _unknown_name(line.verdict)
            assert error.startswith(f"{named}: "), (line.verdict, error)
