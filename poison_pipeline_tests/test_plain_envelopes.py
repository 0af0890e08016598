"""The vectorised enqueue path agrees with `parse_envelope` on every line it vouches for, and a file
enqueued through it lands and refuses exactly as the per-record path alone would."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from poison_pipeline.domain.envelope import EnvelopeError, parse_envelope
from poison_pipeline.operations.enqueue import enqueue_data
from poison_pipeline.operations.jsonl import screen
from poison_pipeline.operations.plain_envelopes import joined, plain_lines
from poison_pipeline.operations.records import Parsed, _ascii_lines, _object_line, _raw, enqueue, envelope_table, land
from poison_pipeline_tests.support import queue, rows

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
TTL = timedelta(hours=1)

_SCALARS: list[Any] = [0, 1, -1, -0.0, 1.5, 1.0, 1.50, 0.1, 1e-05, 0.0001, 12345678.5, 1e16, 1e100,
                       0.123456789, 10**25, True, False, None, "", "x", "a b", 'q"uote', "back\\slash",
                       "tab\t", "new\nline", "slash/", "caf\u00e9", "\u2603", "\U0001f600", "NaN"]
_TIMES = ["2026-01-01T00:00:00", "2026-01-01T00:00:00Z", "2026-01-01 10:30:00.5+02:00",
          "2026-01-01T00:00:00.123456-05:30", "2026-02-30T00:00:00Z", "2026-01-01T24:00:00",
          "2026-01-01", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59", "tomorrow", 5, None,
          "2026-01-01T00:00:00.1234567Z", "2026-13-01T00:00:00"]
_NUMBER_SPELLINGS = ["1", "-0", "0.0", "1.10", "1E5", "1e-7", "0.00001", "123456789012345678901",
                     "3.25", "-2.5", "NaN", "Infinity"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth == 0 and roll < 0.6:
        return {"a": _value(rng, 1), "b": [_value(rng, 2)]}
    if depth < 3 and roll < 0.25:
        return {rng.choice(["a", "b", "body", "k y", "n"]): _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 3 and roll < 0.35:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice(_SCALARS)


def _pick(rng: random.Random, usual: list[Any], odd: list[Any]) -> Any:
    return rng.choice(usual) if rng.random() < 0.9 else rng.choice(odd)


def _envelope(rng: random.Random, n: int) -> dict[str, Any]:
    record: dict[str, Any] = {"message_id": _pick(rng, [f"m-{n}", f"m-{n % 500}"], ["", None, 5, "x" * 257]),
                              "message_type": _pick(rng, ["t", "order", "y" * 256], ["", "y" * 257])}
    if rng.random() < 0.85:
        record["body"] = _pick(rng, [_value(rng), {"order": n, "lines": [1, 2.5], "note": "ok"}],
                               ["plain text", "<a/>", None, 7, {"big": "z" * 300}])
    if rng.random() < 0.3:
        record["encoding"] = rng.choice(["json", "text", "empty", "xml", "binary", "", "yaml", None])
    if rng.random() < 0.05:
        record["body_base64"] = rng.choice(["AP8=", "!!", None])
    for name in ("conversation_id", "sender"):
        if rng.random() < 0.2:
            record[name] = rng.choice(["c", "", None, 3, "z" * 257])
    if rng.random() < 0.2:
        record["sequence_number"] = rng.choice([1, 0, -4, 1.0, True, "2", None, 2**70])
    for name in ("enqueued_at", "expires_at"):
        if rng.random() < 0.2:
            record[name] = rng.choice(_TIMES)
    if rng.random() < 0.1:
        record["headers"] = rng.choice([{}, None, {"k": "v"}, {"k": 1}, [], ""])
    if rng.random() < 0.03:
        record["colour"] = "red"
    keys = list(record)
    rng.shuffle(keys)
    if "body" in keys and rng.random() < 0.6:  # where most producers put it
        keys.append(keys.pop(keys.index("body")))
    return {key: record[key] for key in keys}


def _spell(rng: random.Random, record: dict[str, Any]) -> str:
    style = rng.random()
    if style < 0.4:
        text = json.dumps(record)
    elif style < 0.6:
        text = json.dumps(record, separators=(",", ":"))
    elif style < 0.75:
        text = json.dumps(record, ensure_ascii=False)
    elif style < 0.85:
        text = "  " + json.dumps(record, separators=(" , ", " : ")) + " \r"
    else:
        text = json.dumps(record)
        spelling = rng.choice(_NUMBER_SPELLINGS)
        text = text.replace("1.5", spelling, 1) if "1.5" in text else text.replace('"ok"', spelling, 1)
    if rng.random() < 0.03:
        text = text.replace('"message_type"', '"message_type": "dup", "message_type"', 1)
    if rng.random() < 0.03:
        text = text[:-1] + ', "body": 1}'
    if rng.random() < 0.02:
        text = text.replace("a", "\\u0061", 1)
    if rng.random() < 0.02:
        text = text[: rng.randint(1, len(text))]
    return text


def _lines(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [_spell(rng, _envelope(rng, n)) for n in range(count)]


def test_every_line_the_vectorised_path_reads_is_read_the_same_by_parse_envelope() -> None:
    texts = _lines(6000, seed=7)
    array = pa.array(texts, pa.large_string())
    mask, envelopes = plain_lines(*joined(array), NOW, TTL, 300)
    read = [i for i, ok in enumerate(mask) if ok]
    assert len(read) > 400, "the generated lines should exercise the vectorised path"
    assert len(read) < len(texts) - 1000, "and leave many lines to the per-record path"
    expected = []
    for i in read:
        try:
            expected.append(parse_envelope(json.loads(texts[i]), NOW, TTL, 300))
        except (EnvelopeError, ValueError) as error:
            raise AssertionError(f"read {texts[i]!r}, which parse_envelope refuses: {error}") from None
    got, want = envelopes.to_pylist(), envelope_table(expected).to_pylist()
    for i, g, w in zip(read, got, want, strict=True):
        assert g == w, texts[i]


def test_a_file_lands_and_is_refused_exactly_as_line_by_line(make_declaration, monkeypatch) -> None:
    # Slices of 500 lines: the file is read by several threads, each from a line boundary.
    monkeypatch.setattr("poison_pipeline.operations.records._SLICE_ROWS", 500)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    texts = _lines(3000, seed=11)
    data = ("\n".join(texts[:1500]) + "\n\n  \n" + "\n".join(texts[1500:])).encode("utf-8", "surrogatepass")
    spec = queue(time_to_live="1h", max_body_bytes=300)["q"]
    declaration = make_declaration({"q": spec, "r": spec})
    result = enqueue_data(declaration, "q", data, now=NOW)

    # The per-record path alone, as `enqueue_lines` ran before the vectorised path existed.
    screened, others = [], []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            text, problem = screen(raw)
            if text is None:
                screened.append((number, None, problem))
            else:
                others.append((number, text))
    baseline = land(declaration, "r", Parsed.none(), others, lambda n: "", NOW)

    assert result.lines == len(screened) + len(others)
    assert result.accepted == baseline.accepted > 500
    assert [(r.line.number, r.message_id, r.error) for r in result.refused] == \
        sorted(screened + [(r.line, r.message_id, r.error) for r in baseline.refused])
    assert any("appears twice" in r.error for r in result.refused)

    def landed(name: str) -> list[dict[str, Any]]:
        return sorted(({k: v for k, v in row.items() if k != "batch_id"} for row in rows(declaration, "inbound", name)),
                      key=lambda row: row["message_id"])

    assert landed("q") == landed("r")


def _landed(declaration: Any, name: str) -> list[dict[str, Any]]:
    return sorted(({k: v for k, v in row.items() if k != "batch_id"} for row in rows(declaration, "inbound", name)),
                  key=lambda row: row["message_id"])


def test_the_python_api_given_a_file_reads_it_as_the_cli_does(make_declaration, tmp_path) -> None:
    """`enqueue(declaration, q, path)` and `enqueue(declaration, q, data)`: the lines numbered as in
    the file (blank ones counted), a line that is not UTF-8 refused, each refusal quoting its line."""
    texts = _lines(1200, seed=13)
    data = ("\n".join(texts[:600]) + "\n\n \t\n" + "\n".join(texts[600:])).encode("utf-8", "surrogatepass")
    data += b'\n{"message_id":"latin","message_type":"t","body":"caf\xe9"}\n'
    path = tmp_path / "envelopes.jsonl"
    path.write_bytes(data)
    spec = queue(time_to_live="1h", max_body_bytes=300)["q"]
    declaration = make_declaration({name: spec for name in ("cli", "path", "bytes")})

    cli = enqueue_data(declaration, "cli", data, now=NOW)
    given_path, given_bytes = enqueue(declaration, "path", path, now=NOW), enqueue(declaration, "bytes", data, now=NOW)

    expected = [(r.line.number, r.message_id, r.error, r.line.raw.decode("utf-8", "replace")[:1000])
                for r in cli.refused]
    assert expected[-1][:3] == (1203, None, "not valid UTF-8 at byte 52 (send binary bodies base64-encoded in "
                                "body_base64 with encoding 'binary')")
    for result in (given_path, given_bytes):
        assert [(r.line, r.message_id, r.error, r.record) for r in result.refused] == expected
        assert result.accepted == cli.accepted > 300
    assert _landed(declaration, "path") == _landed(declaration, "bytes") == _landed(declaration, "cli")
    # A path given as a plain string would be read as its characters, each refused as a record.
    with pytest.raises(TypeError, match=r"records is one string \(.*: pass a list of JSON texts, or a JSON "
                                        "Lines file as a pathlib.Path"):
        enqueue(declaration, "path", str(path), now=NOW)
    assert _landed(declaration, "path") == _landed(declaration, "cli")


def test_a_list_of_texts_is_read_together_and_refused_as_record_by_record(make_declaration) -> None:
    """ASCII texts are joined into one buffer (no work per text); a list with anything else falls
    back to sorting the texts one by one. Either way each record is landed or refused as the
    per-record path alone would."""
    texts = [text for text in _lines(1500, seed=17) if text.isascii()]
    mixed = [*texts[:700], {"message_id": "decoded", "message_type": "t"}, "caf\u00e9", *texts[700:]]
    assert _ascii_lines(texts) is not None and _ascii_lines(mixed) is None
    spec = queue(time_to_live="1h", max_body_bytes=300)["q"]
    declaration = make_declaration({name: spec for name in ("joined", "mixed", "alone", "mixed_alone")})

    for records, name, alone in ((texts, "joined", "alone"), (mixed, "mixed", "mixed_alone")):
        result = enqueue(declaration, name, records, now=NOW)
        baseline = land(declaration, alone, Parsed.none(), list(enumerate(records, start=1)),
                        lambda n, records=records: records[n - 1] if isinstance(records[n - 1], str)
                        else json.dumps(records[n - 1]), NOW)
        assert [(r.line, r.message_id, r.error, r.record) for r in result.refused] == \
            [(r.line, r.message_id, r.error, r.record) for r in baseline.refused]
        assert result.accepted == baseline.accepted > 300
        assert _landed(declaration, name) == _landed(declaration, alone)


def test_a_list_of_dicts_is_written_as_lines_and_landed_as_record_by_record(make_declaration) -> None:
    """Dicts are written as JSON lines in one pass and read by the vectorised path; what it leaves
    (and a dict JSON cannot write at all) is checked as its dict. Either way each record is landed
    or refused as the per-record path alone would."""
    rng = random.Random(19)
    records = [_envelope(rng, n) for n in range(1500)]
    cycle: dict[str, Any] = {"a": 1}
    cycle["self"] = cycle
    odd: list[dict[Any, Any]] = [
        {"message_id": "when", "message_type": "t", "body": {"at": datetime(2026, 1, 1, tzinfo=UTC)}},
        {"message_id": "nan", "message_type": "t", "body": {"x": float("nan")}},
        {"message_id": "cycle", "message_type": "t", "body": cycle},
        {"message_id": "keys", "message_type": "t", "body": {1: "one", 2.5: "half", None: "no"}},
        {"message_id": "tuple", "message_type": "t", "body": {"pair": (1, 2)}},
        {"message_id": "lines", "message_type": "t", "body": {"lines": [{"sku": "a"}, {"sku": "b"}], "n": "},{"}},
        {1: "x", "message_id": "int key", "message_type": "t"},
        {"message_id": "late", "message_type": "t", "enqueued_at": datetime(2026, 1, 1, tzinfo=UTC)},
    ]
    records = [*records[:700], *odd, *records[700:]]
    lines = [_object_line(record) for record in records]
    assert all(line.isascii() and "\n" not in line for line in lines)
    mask, _ = plain_lines(*joined(pa.array(lines, pa.large_string())), NOW, TTL, 300)
    assert mask.sum() > 150, "the generated dicts should exercise the vectorised path"
    spec = queue(time_to_live="1h", max_body_bytes=300)["q"]
    declaration = make_declaration({name: spec for name in ("dicts", "alone")})

    result = enqueue(declaration, "dicts", records, now=NOW)
    baseline = land(declaration, "alone", Parsed.none(), list(enumerate(records, start=1)),
                    lambda n: _raw(records[n - 1]), NOW)
    assert [(r.line, r.message_id, r.error, r.record) for r in result.refused] == \
        [(r.line, r.message_id, r.error, r.record) for r in baseline.refused]
    assert result.accepted == baseline.accepted > 300
    assert _landed(declaration, "dicts") == _landed(declaration, "alone")
    landed = {row["message_id"]: row for row in _landed(declaration, "dicts")}
    assert landed["keys"]["body"] == b'{"1":"one","2.5":"half","null":"no"}'
    assert landed["lines"]["body"] == b'{"lines":[{"sku":"a"},{"sku":"b"}],"n":"},{"}'
    assert {"when", "nan", "cycle", "int key"}.isdisjoint(landed)


def test_the_file_splitter_finds_the_lines_split_lines_finds(monkeypatch):
    """The bytes splitter of `enqueue_data` keeps exactly the non-blank lines, numbered as an editor
    shows them: whitespace-only lines of every kind, empty lines, no final newline; a big file is
    searched for newlines a chunk per core."""
    from poison_pipeline.operations.enqueue import split_lines
    from poison_pipeline.operations.jsonl import newlines, split_data

    many = np.frombuffer(random.Random(3).randbytes(50_000), dtype=np.uint8)
    monkeypatch.setattr("poison_pipeline.operations.jsonl._CHUNK_BYTES", 1000)
    for cores in (2, 3, 7):
        monkeypatch.setattr("os.cpu_count", lambda cores=cores: cores)
        assert np.array_equal(newlines(many), np.flatnonzero(many == 0x0A))
    monkeypatch.undo()

    rng = random.Random(5)
    alphabet = [b" ", b"\t", b"\r", b"\x0b", b"\x0c", b"{", b"}", b"a", b"\xff", b"\n", b"\n"]
    for _ in range(3000):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        data, starts, ends, numbers = split_data(data)
        raws = [data[start:end] for start, end in zip(starts.tolist(), ends.tolist(), strict=True)]
        assert list(zip(numbers.tolist(), raws, strict=True)) == [
            (line.number, line.raw) for line in split_lines(data)], data
