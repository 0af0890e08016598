"""What the fuzz tests share: hypothesis profiles sized per test, counters of what they generated,
and the strategies for envelope lines (each line knowing whether it is valid, and if not which
field it breaks).

`HYPOTHESIS_PROFILE=ci` (the default, in `make test`) is bounded; `long` (`make fuzz`) generates at
least 10,000 envelopes, declarations and argument lists. Hypothesis keeps no database here.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from poison_pipeline.domain.envelope import TEXT_LIMIT

PROFILE_ENV = "HYPOTHESIS_PROFILE"
# Examples per property and profile. An envelope example is a whole batch of lines.
BUDGETS = {
    "ci": {"envelopes": 14, "cli_enqueue": 4, "objects": 6, "declarations": 300, "yaml": 60, "argv": 160,
           "predicates": 400},
    "long": {"envelopes": 90, "cli_enqueue": 25, "objects": 40, "declarations": 10_000, "yaml": 1_000,
             "argv": 10_000, "predicates": 10_000},
}
COUNTS: Counter[str] = Counter()


def register_profiles() -> None:
    for name in BUDGETS:
        settings.register_profile(name, database=None, deadline=None, print_blob=True,
                                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile(active_profile())


def active_profile() -> str:
    return os.environ.get(PROFILE_ENV, "ci")


def fuzz_settings(kind: str) -> settings:
    return settings(settings.get_profile(active_profile()), max_examples=BUDGETS[active_profile()][kind])


# ---------------------------------------------------------------------------------------------- lines

# Every field of an envelope, and what a line broken as a whole is refused with.
LINE_LEVEL = ("not valid UTF-8", "not valid JSON", "an envelope must be a JSON object")
TTL = timedelta(days=1)
MAX_BODY = 20_000


@dataclass(frozen=True)
class Line:
    """A generated line. `verdict`: "valid", the field a refusal must name, "line" (refused as a
    whole) or "any" (no expectation beyond the universal ones)."""

    raw: bytes
    verdict: str
    message_id: str | None = None
    body: bytes | None = None


unicode_text = st.characters(exclude_categories=("Cs",))
# Ids of every shape: plain, any Unicode (NUL, newlines, quotes, backslashes, emoji), paths, the
# longest allowed, and a small pool so that batches repeat ids.
ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9._-]{1,16}", fullmatch=True),
    st.text(unicode_text, min_size=1, max_size=40),
    st.sampled_from(["dup-1", "dup-2", "ORD-0001", "../../etc/passwd", " ", "\x00", "'; DROP TABLE x;--",
                     "x" * TEXT_LIMIT, "\U0001f600" * TEXT_LIMIT, "a\\u0000b", "<script>"]),
)
texts = st.text(unicode_text, min_size=1, max_size=60)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(unicode_text, max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(unicode_text, max_size=8), inner, max_size=4),
    max_leaves=6,
)
_ZONES = [None, UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=3))]
timestamps = st.builds(
    lambda moment, style: {0: moment.isoformat(), 1: moment.isoformat(sep=" "),
                           2: moment.isoformat().replace("+00:00", "Z")}[style],
    st.datetimes(datetime(1900, 1, 2), datetime(8999, 12, 30), timezones=st.sampled_from(_ZONES)),
    st.integers(0, 2),
)


class _Reduces:
    """Unpickling it would run `open(path, "w")`: a body that must only ever be stored as bytes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def pickle_bytes(path: str, protocol: int) -> bytes:
    return pickle.dumps(_Reduces(path), protocol=protocol)


CODE_TEXTS = [
    "__import__('os').system('touch {path}')",
    "open('{path}', 'w').write('x')",
    "!!python/object/apply:os.system ['touch {path}']",
    "{{{{ ''.__class__.__mro__[1].__subclasses__() }}}}",
    "$(touch {path})",
]


@st.composite
def bodies(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """Body fields of a valid envelope, and the body bytes it is stored with."""
    kind = draw(st.sampled_from(["json", "json", "json_text", "text", "xml", "binary", "pickle", "empty", "huge"]))
    if kind == "json":
        value = draw(json_values.filter(lambda v: v is not None and not isinstance(v, str)))
        fields = {"body": value} if draw(st.booleans()) else {"body": value, "encoding": "json"}
        return fields, json.dumps(value, separators=(",", ":")).encode()
    if kind == "json_text":  # a string body of a json message is its JSON text, kept as written
        text = json.dumps(draw(json_values), indent=draw(st.sampled_from([None, 2])))
        return {"body": text, "encoding": "json"}, text.encode()
    if kind == "text":
        text = draw(st.text(unicode_text, max_size=80) | st.sampled_from(CODE_TEXTS))
        return {"body": text, "encoding": "text"}, text.encode()
    if kind == "xml":
        words = draw(st.text(st.characters(categories=("L", "N", "Zs")), max_size=30))
        text = f'<r a="1">{words}<c/></r>'
        return {"body": text, "encoding": "xml"}, text.encode()
    if kind in ("binary", "pickle"):
        raw = draw(st.binary(max_size=60)) if kind == "binary" else pickle_bytes("/nonexistent/never", draw(
            st.integers(0, pickle.HIGHEST_PROTOCOL)))
        return {"body_base64": base64.b64encode(raw).decode(), "encoding": "binary"}, raw
    if kind == "huge":
        size = draw(st.integers(1_000, MAX_BODY - 20))
        value = {"x": "y" * size}
        return {"body": value}, json.dumps(value, separators=(",", ":")).encode()
    return draw(st.sampled_from([{}, {"body": None}, {"encoding": "empty"}])), b""


@st.composite
def valid_envelopes(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    record: dict[str, Any] = {"message_id": draw(ids), "message_type": draw(texts)}
    fields, body = draw(bodies())
    record.update(fields)
    if draw(st.booleans()):
        record["conversation_id"] = draw(texts)
        if draw(st.booleans()):
            record["sequence_number"] = draw(st.integers(-(2**63), 2**63 - 1))
    for name in ("enqueued_at", "expires_at"):
        if draw(st.integers(0, 3)) == 0:
            record[name] = draw(timestamps)
    if draw(st.integers(0, 3)) == 0:
        record["sender"] = draw(texts)
    if draw(st.integers(0, 3)) == 0:
        record["headers"] = draw(st.dictionaries(st.text(unicode_text, max_size=10), st.text(unicode_text, max_size=10),
                                                 max_size=3))
    return record, body


_WRONG = [0, 7, -1.5, True, False, [], ["x"], {}, {"a": 1}]
_SURROGATE = "a\ud800b"
# (field, how it is broken): values no envelope may carry there, whatever the other fields say.
BREAKS: dict[str, list[Any]] = {
    "message_id": [_WRONG, ["", None, "x" * (TEXT_LIMIT + 1), _SURROGATE, "\udfff"]],
    "message_type": [_WRONG, ["", None, "y" * (TEXT_LIMIT + 1), _SURROGATE]],
    "conversation_id": [[v for v in _WRONG if v not in (False, 0)], ["z" * (TEXT_LIMIT + 1), _SURROGATE]],
    "sender": [[v for v in _WRONG if v not in (False, 0)], ["s" * (TEXT_LIMIT + 1), _SURROGATE]],
    "sequence_number": [["1", 1.5, True, [], {}], [2**63, -(2**63) - 1, 10**30]],
    "encoding": [[0, 1, True, [], ["json"], {"a": 1}], ["yaml", "JSON", " json", "utf-8"]],
    "enqueued_at": [[0, 1_700_000_000, True, [], {}], ["tomorrow", "2026-02-30T00:00:00", "2026-13-01T00:00:00",
                                                      "10000-01-01T00:00:00", "0001-01-01T00:00:00+01:00",
                                                      "9999-12-31T20:00:00Z"]],
    "expires_at": [[0, True, [], {}], ["yesterday", "2026-02-30", "0001-01-01T00:30:00+01:00",
                                       "9999-12-31T23:59:59-01:00"]],
    "headers": [[[], "", 0, 5, True, ["k", "v"]], [{"k": 1}, {"k": None}, {"k": ["v"]}, {"k": _SURROGATE},
                                                  {_SURROGATE: "v"}]],
    "body_base64": [[5, None, [], {}], ["!!", "abc", "====", "\u00e9t\u00e9"]],
}


@st.composite
def broken_envelopes(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A valid envelope with one field broken, and that field (the one its refusal must name)."""
    record, _ = draw(valid_envelopes())
    field = draw(st.sampled_from([*BREAKS, "body", "unknown", "missing"]))
    if field == "unknown":
        key = draw(st.text(unicode_text, min_size=1, max_size=12).filter(lambda k: k not in record and k not in BREAKS
                                                                           and k not in ("body", "body_base64")))
        record[key] = draw(json_values)
        return record, key
    if field == "missing":
        field = draw(st.sampled_from(["message_id", "message_type"]))
        del record[field]
        return record, field
    if field == "body":
        return _broken_body(draw, record), "body"
    value = draw(st.sampled_from([v for group in BREAKS[field] for v in group]))
    if field == "body_base64":
        record.pop("body", None)
        record["encoding"] = "binary"
    if field == "sequence_number" and value in (2**63, -(2**63) - 1, 10**30):
        record.setdefault("conversation_id", "c")
    if field == "enqueued_at":
        record.pop("expires_at", None)  # only a time to live makes 9999-12-31T20:00Z overflow
    record[field] = value
    return record, field


def _broken_body(draw: st.DrawFn, record: dict[str, Any]) -> dict[str, Any]:
    for name in ("body", "body_base64", "encoding"):
        record.pop(name, None)
    case = draw(st.integers(0, 8))
    if case == 0:
        record.update(body=draw(st.sampled_from([5, [1], {"a": 1}, True])),
                      encoding=draw(st.sampled_from(["text", "xml"])))
    elif case == 1:
        record.update(body="not json " + draw(st.sampled_from(CODE_TEXTS)), encoding="json")
    elif case == 2:
        record.update(body="<a><b></a>", encoding="xml")
    elif case == 3:
        record.update(body={"a": 1}, encoding="empty")
    elif case == 4:
        record.update(body={"a": 1}, body_base64="AA==")
    elif case == 5:
        record.update(body={"x": "y" * (MAX_BODY + draw(st.integers(1, 5000)))})
    elif case == 6:
        record.update(body={"x": draw(st.sampled_from([_SURROGATE, "\udc80"]))})
    elif case == 7:
        record.update(body="caf\u00e9 " + _SURROGATE, encoding="text")
    else:
        record.update(body_base64=base64.b64encode(b"\xff\xfe" + os.urandom(4)).decode(), encoding="json")
    return record


def spell(draw: st.DrawFn, record: dict[str, Any]) -> bytes:
    """The record as one JSON line, in one of the ways producers write it (the plainest ones are
    what the vectorised path reads)."""
    keys = list(record)
    if draw(st.booleans()) and "body" in keys:  # where most producers put it
        keys.append(keys.pop(keys.index("body")))
    else:
        keys = draw(st.permutations(keys))
    ordered = {key: record[key] for key in keys}
    style = draw(st.integers(0, 3))
    if style == 2 and not _encodable(json.dumps(ordered, ensure_ascii=False)):
        style = 1  # a lone surrogate written raw is no UTF-8: it must stay escaped to reach its field
    if style == 0:
        text = json.dumps(ordered, separators=(",", ":"))
    elif style == 1:
        text = json.dumps(ordered)
    elif style == 2:
        text = json.dumps(ordered, ensure_ascii=False)
    else:
        text = "  " + json.dumps(ordered, separators=(" , ", " : ")) + " \r"
    return text.encode("utf-8", "surrogatepass")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@st.composite
def lines(draw: st.DrawFn) -> Line:
    kind = draw(st.sampled_from(["valid"] * 6 + ["broken"] * 3 + ["line", "any"]))
    if kind == "valid":
        record, body = draw(valid_envelopes())
        return Line(spell(draw, record), "valid", record["message_id"], body)
    if kind == "broken":
        record, field = draw(broken_envelopes())
        return Line(spell(draw, record), field, record.get("message_id") if isinstance(record.get("message_id"), str)
                    else None)
    if kind == "line":
        return Line(draw(_broken_line()), "line")
    return Line(draw(_chaos()), "any")


@st.composite
def _broken_line(draw: st.DrawFn) -> bytes:
    record, _ = draw(valid_envelopes())
    raw = spell(draw, record).strip()
    case = draw(st.integers(0, 4))
    at = draw(st.integers(1, len(raw) - 1))
    if case == 0:  # a byte never found in UTF-8
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80"])) + raw[at:]
    if case == 1:  # a raw NUL or control byte: never JSON outside a string's escapes
        return raw[:at] + draw(st.sampled_from([b"\x00", b"\x01", b"\x1f"])) + raw[at:]
    if case == 2:
        return raw[:at]
    if case == 3:
        return json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
    depth = draw(st.integers(5_000, 200_000))
    return (b'{"message_id":"deep","message_type":"t","body":' + b"[" * depth + b"]" * depth + b"}")


@st.composite
def _chaos(draw: st.DrawFn) -> bytes:
    """Lines with no expectation but the universal ones: huge numbers, NaN, mixed garbage."""
    case = draw(st.integers(0, 3))
    if case == 0:
        number = draw(st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "9" * 5000, "9" * 300, "1e-400",
                                       "123456789012345678901234567890"]))
        return f'{{"message_id":"n-{draw(st.integers(0, 9))}","message_type":"t","body":{{"x":{number}}}}}'.encode()
    if case == 1:
        return draw(st.binary(min_size=1, max_size=80).filter(lambda b: b.strip() and b"\n" not in b))
    if case == 2:
        return ('{"message_id":"a","message_type":"t","body":' + "{\"a\":" * 300 + "1" + "}" * 300 + "}").encode()
    text = draw(st.text(unicode_text | st.sampled_from(list('{}[]":,\\')), min_size=1, max_size=80))
    return text.encode("utf-8").replace(b"\n", b" ") if text.strip() else b"{"


def plain_lines(rng: random.Random, count: int) -> list[Line]:
    """Valid envelopes as most producers write them (compact ASCII, the body last), cheap to make by
    the thousand: the lines the vectorised path reads. Some repeat an id."""
    made = []
    for n in range(count):
        message_id = f"bulk-{rng.randrange(count * 4)}"
        body = {"n": rng.randrange(-10**6, 10**6), "sku": f"S{rng.randrange(100)}",
                "lines": [rng.randrange(10) for _ in range(rng.randrange(4))], "ok": rng.random() < 0.5}
        record: dict[str, Any] = {"message_id": message_id, "message_type": rng.choice(["order", "refund"])}
        if rng.random() < 0.3:
            record.update(conversation_id=f"c-{rng.randrange(50)}", sequence_number=n)
        if rng.random() < 0.2:
            record["enqueued_at"] = f"2026-0{rng.randrange(1, 10)}-1{rng.randrange(10)}T10:00:00Z"
        if rng.random() < 0.2:
            record["sender"] = "erp"
        record["body"] = body
        made.append(Line(json.dumps(record, separators=rng.choice([(",", ":"), (", ", ": ")])).encode(), "valid",
                         message_id, json.dumps(body, separators=(",", ":")).encode()))
    return made


@st.composite
def batches(draw: st.DrawFn, drawn: int = 60, bulk: int = 400) -> list[Line]:
    """Generated lines of every kind, mixed at random places with up to `bulk` plain ones."""
    hostile = draw(st.lists(lines(), min_size=1, max_size=drawn))
    count = draw(st.integers(bulk // 2, bulk))  # hypothesis leans to small numbers: half at least
    # One drawn seed, not a choice per line: a batch of hundreds stays within hypothesis's size limit.
    rng = random.Random(draw(st.integers(0, 2**32)))
    mixed = hostile + plain_lines(rng, count)
    rng.shuffle(mixed)
    return mixed
