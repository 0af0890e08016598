"""The vectorised path of enqueue: the lines that are plainly valid envelopes, decoded with pyarrow.

It vouches only for lines it can prove `domain.envelope.parse_envelope` accepts and decodes to the
very same envelope (same fields, same body bytes); every other line is left to the per-record path,
which alone refuses and words the refusal. So this module adds no rule of its own: it narrows each
rule to a case that is plain to check on whole columns, and `test_plain_envelopes.py` checks it
against `parse_envelope` line by line on generated envelopes.

Each line is read once, whole, by pyarrow's JSON reader (the envelope fields with their types, the
body inferred: that is what proves it one JSON value without repeated keys); the body's bytes are
then cut out of the line by position. The checks before the read are what make the cut exact.

What it leaves to the per-record path (all still accepted or refused there, only slower): bytes
outside printable ASCII (tabs and CR aside), backslashes (escapes), `body_base64`, non-empty
`headers`, `xml`/`binary` bodies, a JSON body that is a string, number or literal or that other
members follow (the body last is what most producers write), a body whose compact form
`json.dumps` would write differently (exponents, long or trailing-zero fractions, NaN),
timestamps other than `YYYY-MM-DD[T ]hh:mm:ss[.f{1,6}][Z|±hh:mm]`, lines with more than 256
brackets (nesting), lines that do not start with `{`, and any line pyarrow's JSON reader refuses
(wrong types, unknown or repeated fields).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from poison_pipeline.domain.envelope import ENCODINGS, FIELDS, TEXT_LIMIT
from poison_pipeline.storage import schemas

# In a body with its strings hidden: number spellings `json.dumps` would not write back the same (an
# exponent, -0, a fraction ending in 0 other than .0, below 1e-4, more digits than a float keeps,
# integers long enough to meet Python's digit limit), and any letter that true, false and null do
# not have (NaN, Infinity).
_NON_CANONICAL = (r'\d[eE]|-0(?:[^.0-9]|$)|\.\d+0(?:[^0-9]|$)|(?:^|[^0-9])0\.0000|\d{8}\.|\.\d{8}|\d{19}'
                  r'|[A-Zb-dg-kmo-qv-z]')
_MAX_BRACKETS = 256
_TIMESTAMP = (r'^[1-9]\d{3}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])[T ](?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d'
              r'(?:\.\d{1,6})?')
_ZONE = r'(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$'
# Far from the ends of Python's datetime range, so that no offset or time to live overflows it.
_EARLIEST, _LATEST = datetime(1900, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)

_HEAD = pa.schema([
    pa.field("message_id", pa.string()),
    pa.field("conversation_id", pa.string()),
    pa.field("sequence_number", pa.int64()),
    pa.field("message_type", pa.string()),
    pa.field("encoding", pa.string()),
    pa.field("enqueued_at", pa.string()),
    pa.field("expires_at", pa.string()),
    pa.field("sender", pa.string()),
    # An empty struct reads `{}` and null; a member makes the reader give it fields: per record.
    pa.field("headers", pa.struct([])),
])
assert set(_HEAD.names) | {"body", "body_base64"} == FIELDS
_READ = set(_HEAD.names) | {"body"}
_BODY_KEY = b'"body":'
_QUOTE, _OPEN, _CLOSE, _OPEN_LIST, _CLOSE_LIST = (ord(c) for c in '"{}[]')
_BLANKS = (0x20, 0x09, 0x0D)  # the only bytes below 0x21 a plain line holds (the newline ending it aside)
# The body's first byte sorts the lines into reads of their own: pyarrow refuses a column that is a
# string in one line and an object in another.
_OBJECT, _LIST, _TEXT = 1, 2, 3


def joined(lines: pa.Array) -> tuple[pa.Buffer, np.ndarray]:
    """Texts (no newline in them) as lines end to end, each with its newline: their data and offsets."""
    newline, nothing = pa.scalar(b"\n", pa.large_binary()), pa.scalar(b"", pa.large_binary())
    together = pc.binary_join_element_wise(pc.fill_null(lines.cast(pa.large_binary()), nothing), newline, nothing)
    return together.buffers()[2] or pa.py_buffer(b""), _offsets(together)


def plain_lines(data: pa.Buffer, offsets: np.ndarray, now: datetime, time_to_live: timedelta | None,
                max_body_bytes: int) -> tuple[np.ndarray, pa.Table]:
    """Which lines are plainly valid, and their envelopes. Line i is `data[offsets[i]:offsets[i + 1]]`
    and ends with its newline.

    Returns a mask over the lines and, for the lines it marks, the envelope columns of
    `schemas.ENVELOPE_FIELDS` in line order."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if n == 0:
        return np.zeros(0, dtype=bool), pa.schema(schemas.ENVELOPE_FIELDS).empty_table()
    raw = np.frombuffer(data, dtype=np.uint8)
    starts, ends = offsets[:-1], offsets[1:] - 1  # ends: where each line's newline is
    plain = (ends > starts) & (raw[np.minimum(ends, len(raw) - 1)] == 0x0A)
    region = raw[offsets[0]:offsets[-1]]
    # Bytes outside printable ASCII and backslashes (escapes): such a line goes per record.
    # Below 0x20 or above 0x7E in one comparison: shifted down by 0x20, the former wrap round.
    outside = (region - np.uint8(0x20)) > 0x5E
    outside |= region == 0x5C
    odd = np.flatnonzero(outside) + offsets[0]
    line = np.searchsorted(offsets, odd, side="right") - 1
    kinds = raw[odd]
    plain[line[~np.isin(kinds, _BLANKS) & ((kinds != 0x0A) | (odd != ends[line]))]] = False
    # pyarrow's JSON reader nests a call per level (a line 100,000 levels deep crashed the process)
    # and Python's stops near 1,000: a line with many brackets is left to the per-record path.
    brackets = np.flatnonzero((region | 0x20) == _OPEN) + offsets[0]  # "[" is "{" without bit 0x20
    plain &= np.diff(np.searchsorted(brackets, offsets)) <= _MAX_BRACKETS

    first = _skip(raw, starts, ends, +1)
    last = _skip(raw, ends - 1, starts, -1)
    plain &= (raw[first] == _OPEN) & (raw[last] == _CLOSE)
    texts = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), data])
    # The first `"body` must be the key `"body":`: then it is the top-level member (the members before
    # it hold no keys, as the read below proves), and no `body_base64` or `"body" :` comes first.
    key = np.asarray(pc.find_substring(texts, '"body').to_numpy(zero_copy_only=False), dtype=np.int64)
    has_body = key >= 0
    at = starts + np.where(has_body, key, 0)
    plain &= ~has_body | _spells(raw, at, ends, _BODY_KEY)
    body_start = np.where(has_body, _skip(raw, np.minimum(at + len(_BODY_KEY), ends), ends, +1), 0)
    body_end = np.where(has_body, _skip(raw, np.maximum(last - 1, 0), body_start, -1) + 1, 0)
    opening, closing = raw[body_start], raw[np.maximum(body_end - 1, 0)]
    kind = np.where(~has_body, _OBJECT, np.where(opening == _OPEN, _OBJECT, np.where(
        opening == _OPEN_LIST, _LIST, np.where(opening == _QUOTE, _TEXT, 0))))
    json_body = has_body & (kind != _TEXT)
    text_body = has_body & (kind == _TEXT)
    plain &= kind > 0
    # Nothing may follow the body: the line's last member ends where the line's last brace begins. A
    # JSON body must close there with its own bracket; of the other members only `"headers": {}` ends
    # with a bracket (the read proves it), so a `{}` that is not the body itself closing there is not plain.
    before_close = _skip(raw, np.maximum(body_end - 2, 0), body_start, -1)
    plain &= ~json_body | ((body_end - body_start >= 2) & (
        ((opening == _OPEN) & (closing == _CLOSE) & ((raw[before_close] != _OPEN) | (before_close == body_start)))
        | ((opening == _OPEN_LIST) & (closing == _CLOSE_LIST))))
    # A text body: one string, no quote inside it (another member would bring its own).
    text_rows = np.flatnonzero(plain & text_body)
    if len(text_rows):
        inner = _cut(data, body_start[text_rows] + 1, np.maximum(body_end[text_rows] - 1, body_start[text_rows] + 1))
        quoted = (closing[text_rows] == _QUOTE) & (body_end[text_rows] - body_start[text_rows] >= 2)
        plain[text_rows] &= quoted & (_numpy(pc.count_substring(inner, '"')) == 0)

    head, read = _read_lines(texts, plain, kind)
    plain &= read

    bodies = _Bodies(data, body_start, body_end, plain & json_body, plain & text_body)
    plain &= bodies.canonical & (bodies.size <= max_body_bytes)

    encoding = pc.if_else(_true(pc.equal(pc.fill_null(head["encoding"], ""), "")),
                          pc.if_else(has_body, "json", "empty"), head["encoding"])
    plain &= np.where(json_body, _true(pc.equal(encoding, "json")),
                      np.where(text_body, _true(pc.equal(encoding, "text")), _true(pc.equal(encoding, "empty"))))
    assert {"json", "text", "empty"} <= set(ENCODINGS)

    message_id, message_type = head["message_id"], head["message_type"]
    for required in (message_id, message_type):
        plain &= _true(pc.and_(pc.greater(pc.utf8_length(required), 0),
                               pc.less_equal(pc.utf8_length(required), TEXT_LIMIT)))
    conversation_id, sender = _optional(head["conversation_id"]), _optional(head["sender"])
    for optional in (conversation_id, sender):
        plain &= ~_true(pc.greater(pc.utf8_length(optional), TEXT_LIMIT))
    sequence = head["sequence_number"]
    plain &= ~(_true(sequence.is_valid()) & ~_true(conversation_id.is_valid()))

    enqueued_at, fine = _timestamps(head["enqueued_at"], plain)
    plain &= fine
    expires_at, fine = _timestamps(head["expires_at"], plain)
    plain &= fine
    enqueued_at = pc.fill_null(enqueued_at, pa.scalar(now, schemas.TS))
    if time_to_live is not None:
        expires_at = pc.if_else(expires_at.is_valid(), expires_at, pc.add(enqueued_at, pa.scalar(time_to_live)))
    for moment in (enqueued_at, expires_at):
        plain &= ~_true(pc.or_(pc.less(moment, pa.scalar(_EARLIEST, schemas.TS)),
                               pc.greater(moment, pa.scalar(_LATEST, schemas.TS))))

    rows = np.flatnonzero(plain)
    every, take = len(rows) == n, pa.array(rows)
    columns = {
        "message_id": message_id, "conversation_id": conversation_id, "sequence_number": sequence,
        "message_type": message_type, "encoding": encoding,
        "enqueued_at": enqueued_at, "expires_at": expires_at, "sender": sender,
    }
    envelopes = pa.table({name: column if every else pc.take(column, take) for name, column in columns.items()})
    envelopes = envelopes.append_column("body", bodies.of(rows))
    no_headers = pa.MapArray.from_arrays(np.zeros(len(rows) + 1, dtype=np.int32), pa.array([], pa.string()),
                                         pa.array([], pa.string()))
    envelopes = envelopes.append_column("headers", no_headers)
    return plain, envelopes.select(pa.schema(schemas.ENVELOPE_FIELDS).names).cast(pa.schema(schemas.ENVELOPE_FIELDS))


class _Bodies:
    """The stored bytes of the plain bodies: JSON ones compacted (no whitespace outside strings, which
    is what `json.dumps(..., separators=(",", ":"))` writes for a canonical body), text ones unquoted."""

    def __init__(self, data: pa.Buffer, starts: np.ndarray, ends: np.ndarray, json_body: np.ndarray,
                 text_body: np.ndarray) -> None:
        n = len(starts)
        self.json_rows, self.text_rows = np.flatnonzero(json_body), np.flatnonzero(text_body)
        self.compact, masked = _compact(_cut(data, starts[self.json_rows], ends[self.json_rows]))
        self.text = _cut(data, starts[self.text_rows] + 1, ends[self.text_rows] - 1)
        self.canonical = np.ones(n, dtype=bool)
        # A body with its strings hidden: what its numbers and literals are spelled with.
        self.canonical[self.json_rows] = ~_true(pc.match_substring_regex(masked, _NON_CANONICAL))
        self.size = np.zeros(n, dtype=np.int64)
        self.size[self.json_rows] = np.diff(_offsets(self.compact))
        self.size[self.text_rows] = np.diff(_offsets(self.text))

    def of(self, rows: np.ndarray) -> pa.Array:
        """The bodies of `rows` (in line order), without a copy when they are the JSON bodies."""
        if np.array_equal(rows, self.json_rows):
            return self.compact
        # Line i's body: row where[i] of the JSON bodies, then the text ones, then one empty one.
        where = np.full(len(self.size), len(self.json_rows) + len(self.text_rows), dtype=np.int64)
        where[self.json_rows] = np.arange(len(self.json_rows))
        where[self.text_rows] = len(self.json_rows) + np.arange(len(self.text_rows))
        bodies = pa.concat_arrays([self.compact, self.text, pa.array([b""], pa.large_binary())])
        return pc.take(bodies, pa.array(where[rows]))


def _compact(bodies: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each body without its whitespace outside strings, and each body with its strings' bytes
    moved above ASCII (for the number check). Exact for JSON texts without backslashes: each holds an even
    number of quotes, so the parity of the quotes since the first body's start tells a string's bytes."""
    offsets = _offsets(bodies)
    raw = np.frombuffer(bodies.buffers()[2] or b"", dtype=np.uint8)[offsets[0]:offsets[-1]]
    offsets = offsets - offsets[0]
    inside = _inside_strings(raw)
    keep = raw > 0x20
    keep |= inside
    # Each body's bytes move back by the blanks dropped before it.
    kept = offsets - np.searchsorted(np.flatnonzero(~keep), offsets)
    compact = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1, [
        None, pa.py_buffer(kept), pa.py_buffer(raw[keep])])
    # A string's bytes moved above ASCII: no digit, letter, dot or minus is left in it for the
    # check to read, and its neighbours outside (quotes, punctuation) stay what they were.
    hidden = np.left_shift(inside.view(np.uint8), 7)
    hidden |= raw
    masked = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1, [
        None, pa.py_buffer(offsets), pa.py_buffer(hidden)])
    return compact, masked


def _inside_strings(raw: np.ndarray) -> np.ndarray:
    """Per byte, whether an odd number of quotes comes before it or is it: a prefix XOR over the
    quotes, 64 bytes to a machine word (as simdjson does), instead of a running sum per byte."""
    bits = np.packbits(raw == _QUOTE, bitorder="little")
    words = np.concatenate((bits, np.zeros(-len(bits) % 8, dtype=np.uint8))).view(np.uint64)
    for shift in (1, 2, 4, 8, 16, 32):
        words ^= words << np.uint64(shift)
    # Each word's last bit is its quotes' parity: the parity of all the words before it flips it whole.
    carried = np.cumsum(words >> np.uint64(63), dtype=np.uint8) & 1
    words ^= np.concatenate(([0], carried[:-1])).astype(np.uint64) * np.uint64(0xFFFF_FFFF_FFFF_FFFF)
    return np.unpackbits(words.view(np.uint8), count=len(raw), bitorder="little").view(bool)


def _offsets(values: pa.Array) -> np.ndarray:
    """A large binary or string array's offsets into its data buffer."""
    return np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset:values.offset + len(values) + 1]


def _cut(data: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """`data[starts[i]:ends[i]]` for every i (ascending, not overlapping), in one copy: the spans and
    the gaps between them are consecutive elements over the data, and the spans are taken."""
    ends = np.maximum(ends, starts)
    if len(starts) == 0:
        return pa.array([], pa.large_binary())
    bounds = np.empty(2 * len(starts), dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    pieces = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * len(starts) - 1,
                                              [None, pa.py_buffer(bounds), data])
    return pc.take(pieces, pa.array(np.arange(0, 2 * len(starts), 2, dtype=np.int64)))


def _skip(raw: np.ndarray, positions: np.ndarray, limits: np.ndarray, step: int) -> np.ndarray:
    """From each position, step over blanks (space, tab, CR) without passing its limit."""
    positions = np.clip(positions, 0, max(len(raw) - 1, 0)).astype(np.int64)
    moving = np.flatnonzero(np.isin(raw[positions], _BLANKS) & (positions != limits))
    while len(moving):  # a producer writes one blank or none: this runs once or twice
        positions[moving] += step
        still = np.isin(raw[positions[moving]], _BLANKS) & (positions[moving] != limits[moving])
        moving = moving[still]
    return positions


def _spells(raw: np.ndarray, at: np.ndarray, ends: np.ndarray, word: bytes) -> np.ndarray:
    """Whether `word` is spelled at each position, before its line's end."""
    ok = at + len(word) <= ends
    for i, byte in enumerate(word):
        ok &= raw[np.minimum(at + i, len(raw) - 1)] == byte
    return ok


def _numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)


def _true(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column as a numpy mask, null counting as false."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _optional(values: pa.Array) -> pa.Array:
    """`parse_envelope` reads an empty optional text as absent."""
    return pc.if_else(_true(pc.equal(values, "")), pa.scalar(None, pa.string()), values)


def _timestamps(values: pa.Array, plain: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """ISO 8601 texts as UTC timestamps (naive ones read as UTC, as `parse_envelope` does), and which
    rows are fine: absent, or a plain spelling pyarrow reads exactly as `datetime.fromisoformat`."""
    given = _true(values.is_valid())
    spelled = _true(pc.match_substring_regex(values, _TIMESTAMP + f"(?:{_ZONE[:-1]})?$"))
    fine = ~given | spelled
    zoned = _true(pc.match_substring_regex(values, _TIMESTAMP + _ZONE))
    wanted = given & spelled & plain
    result = pa.nulls(len(values), schemas.TS)
    try:
        absent = pa.scalar(None, pa.string())
        with_zone = pc.cast(pc.if_else(wanted & zoned, values, absent), schemas.TS)
        naive = pc.assume_timezone(pc.cast(pc.if_else(wanted & ~zoned, values, absent), pa.timestamp("us")), "UTC")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # An impossible date (30 February) fails the whole cast: leave every given one per record.
        return result, ~given
    result = pc.if_else(zoned, with_zone, naive)
    return result, fine


def _read_lines(texts: pa.Array, wanted: np.ndarray, kind: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """The envelope fields of the wanted lines (a null row for the others) and which ones read: each
    kind of body in reads of its own, a line whose body or fields do not read left out."""
    ok = np.zeros(len(texts), dtype=bool)
    pieces: list[tuple[np.ndarray, pa.Table]] = []
    for body_kind in (_OBJECT, _LIST, _TEXT):
        rows = np.flatnonzero(wanted & (kind == body_kind))
        if len(rows):
            read, found = _read(texts, rows, functools.partial(_vouched, kind=body_kind))
            ok[read] = True
            pieces += found
    return _scatter(len(texts), pieces, _HEAD), ok


def _vouched(table: pa.Table, kind: int) -> bool:
    """Whether a read holds envelope fields only, empty headers, and bodies of the expected kind."""
    if not set(table.column_names) <= _READ or table.schema.field("headers").type != pa.struct([]):
        return False
    if "body" not in table.column_names:
        return True
    body = table.schema.field("body").type
    expected: dict[int, bool] = {_OBJECT: pa.types.is_struct(body) or pa.types.is_null(body),
                                 _LIST: pa.types.is_list(body), _TEXT: pa.types.is_string(body)}
    return expected[kind]


def _read(texts: pa.Array, rows: np.ndarray, accept: Callable[[pa.Table], bool]
          ) -> tuple[np.ndarray, list[tuple[np.ndarray, pa.Table]]]:
    """Read `rows` of `texts` (lines with their newlines) as JSON Lines; the rows that read, and what
    they read. A chunk pyarrow refuses as a whole is halved until the lines it refuses are alone."""
    read: list[np.ndarray] = []
    pieces: list[tuple[np.ndarray, pa.Table]] = []
    pending = [rows]
    while pending:
        chunk = pending.pop()
        table = _read_chunk(texts if len(chunk) == len(texts) else pc.take(texts, pa.array(chunk)))
        if table is not None and table.num_rows == len(chunk) and accept(table):
            read.append(chunk)
            pieces.append((chunk, table))
        elif len(chunk) > 1:
            half = len(chunk) // 2
            pending += [chunk[half:], chunk[:half]]
    return (np.concatenate(read) if read else np.zeros(0, dtype=np.int64)), pieces


def _read_chunk(lines: pa.Array) -> pa.Table | None:
    offsets = _offsets(lines)
    source = lines.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    options = pj.ParseOptions(explicit_schema=_HEAD, unexpected_field_behavior="infer")
    # A block must hold a whole line. The caller already runs a read per core.
    read_options = pj.ReadOptions(use_threads=False, block_size=max(1 << 20, min(source.size + 1, 1 << 30)))
    try:
        return pj.read_json(pa.BufferReader(source), parse_options=options, read_options=read_options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _scatter(n: int, pieces: list[tuple[np.ndarray, pa.Table]], schema: pa.Schema) -> pa.Table:
    """The read rows back at their positions, null elsewhere."""
    if not pieces:
        return pa.table({name: pa.nulls(n, schema.field(name).type) for name in schema.names})
    order = np.concatenate([rows for rows, _ in pieces])
    table = pa.concat_tables([table.select(schema.names).cast(schema) for _, table in pieces])
    if np.array_equal(order, np.arange(n)):  # every line read, in one piece: nothing to move
        return table.combine_chunks()
    position = np.full(n, -1, dtype=np.int64)
    position[order] = np.arange(len(order))
    index = pa.array(position, mask=position < 0)
    return pa.table({name: pc.take(table[name], index).combine_chunks() for name in schema.names})
