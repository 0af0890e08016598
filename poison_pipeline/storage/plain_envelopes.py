"""The vectorised path of enqueue: the lines that are plainly valid envelopes, decoded with pyarrow.

It vouches only for lines it can prove `domain.envelope.parse_envelope` accepts and decodes to the
very same envelope (same fields, same body bytes); every other line is left to the per-record path,
which alone refuses and words the refusal. So this module adds no rule of its own: it narrows each
rule to a case that is plain to check on whole columns, and `test_plain_envelopes.py` checks it
against `parse_envelope` line by line on generated envelopes.

What it leaves to the per-record path (all still accepted or refused there, only slower): bytes
outside printable ASCII (tabs and CR aside), backslashes (escapes), `body_base64`, non-empty
`headers`, `xml`/`binary` bodies, a JSON body that is a string, number or literal or that other
members follow (the body last is what most producers write), a body whose compact form
`json.dumps` would write differently (exponents, long or trailing-zero fractions, NaN),
timestamps other than `YYYY-MM-DD[T ]hh:mm:ss[.f{1,6}][Z|±hh:mm]`, lines with more than 256
brackets (nesting), and any line pyarrow's JSON
reader refuses (wrong types, unknown or repeated fields).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from poison_pipeline.domain.envelope import ENCODINGS, FIELDS, TEXT_LIMIT
from poison_pipeline.storage import schemas

# In a body with its strings overwritten: number spellings `json.dumps` would not write back the same (an
# exponent, -0, a fraction ending in 0 other than .0, below 1e-4, more digits than a float keeps,
# integers long enough to meet Python's digit limit), and any letter that true, false and null do
# not have (NaN, Infinity).
_NON_CANONICAL = (r'\d[eE]|-0(?:[^.0-9]|$)|\.\d+0(?:[^0-9]|$)|(?:^|[^0-9])0\.0000|\d{8}\.|\.\d{8}|\d{19}'
                  r'|[A-Zb-dg-kmo-qv-z]')
_CHUNK_ROWS = 1 << 17
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
    # An empty struct reads `{}` and null and refuses any member: non-empty headers go per record.
    pa.field("headers", pa.struct([])),
])
assert set(_HEAD.names) | {"body", "body_base64"} == FIELDS
_HEAD_AND_BODY = pa.schema([*_HEAD, pa.field("body", pa.int64())])
_BODY_KEY = '"body":'


def plain_envelopes(lines: pa.Array, now: datetime, time_to_live: timedelta | None,
                    max_body_bytes: int) -> tuple[np.ndarray, pa.Table]:
    """Which of `lines` (one JSON text each, printable ASCII) are plainly valid, and their envelopes.

    Returns a mask over `lines` and, for the lines it marks, the envelope columns of
    `schemas.ENVELOPE_FIELDS` in line order."""
    texts = lines.cast(pa.large_string())
    # Without a backslash, a string is written back as it came and every quote opens or closes one.
    plain = ~_true(pc.match_substring_regex(texts, r'\\|"body_base64"'))
    # pyarrow's JSON reader nests a call per level (a line 100,000 levels deep crashed the process)
    # and Python's stops near 1,000: a line with many brackets is left to the per-record path.
    brackets = sum(np.asarray(pc.count_substring(texts, b).to_numpy(zero_copy_only=False), dtype=np.int64)
                   for b in "[{")
    plain &= brackets <= _MAX_BRACKETS
    # The first `"body":` is cut out: what precedes it, closed with a body of its own, must read as
    # an object (so the cut was at the top level), and the body, running to the line's last brace,
    # must read as one JSON value (so nothing follows it). A body followed by other members is left
    # to the per-record path.
    key = np.asarray(pc.find_substring(texts, _BODY_KEY).to_numpy(zero_copy_only=False), dtype=np.int64)
    has_body = key >= 0
    length = np.asarray(pc.binary_length(texts).to_numpy(zero_copy_only=False), dtype=np.int64)
    last_brace = length - 1 - np.asarray(pc.find_substring(pc.binary_reverse(texts.cast(pa.large_binary())),
                                                           "}").to_numpy(zero_copy_only=False), dtype=np.int64)
    at = np.where(has_body, key, 0)
    closed = pc.if_else(has_body, pc.binary_join_element_wise(
        _segments(texts, np.zeros(len(texts), dtype=np.int64), at), _text(_BODY_KEY + "0}"), _text("")), texts)
    wrapped = pc.binary_join_element_wise(_text("{"), _segments(texts, at, np.maximum(last_brace + 1, at)), _text(""))
    rest = pc.utf8_trim_whitespace(_segments(texts, np.minimum(at + len(_BODY_KEY), length),
                                             np.maximum(last_brace, np.minimum(at + len(_BODY_KEY), length))))
    ends_with_body = _true(pc.match_substring_regex(texts, r"[}\]]\s*\}\s*$"))
    json_body = has_body & ends_with_body & _true(pc.match_substring_regex(rest, r"^[\[{]"))
    text_body = has_body & _true(pc.match_substring_regex(rest, r'^"[^"\\]*"$'))
    plain &= ~has_body | json_body | text_body
    # A body spelled otherwise (`"body" :`) was not cut out: such a line is not plain.
    plain &= has_body | ~_true(pc.match_substring(texts, '"body"'))

    head, parsed = _read(closed, plain, _HEAD_AND_BODY)
    plain &= parsed
    body_ok = _valid_bodies(wrapped, plain & json_body)
    plain &= ~json_body | body_ok

    # The compact form is the body without whitespace outside strings.
    compact, masked = _compact(rest.cast(pa.large_binary()))
    plain &= ~json_body | ~_true(pc.match_substring_regex(masked.cast(pa.large_string()), _NON_CANONICAL))
    text = pc.if_else(text_body, pc.utf8_slice_codeunits(rest, 1, -1), "").cast(pa.large_binary())
    body = pc.if_else(json_body, compact, text)
    plain &= _true(pc.less_equal(pc.binary_length(body), max_body_bytes))

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

    take = pa.array(np.flatnonzero(plain))
    columns = {
        "message_id": message_id, "conversation_id": conversation_id, "sequence_number": sequence,
        "message_type": message_type, "body": body.cast(pa.large_binary()), "encoding": encoding,
        "enqueued_at": enqueued_at, "expires_at": expires_at, "sender": sender,
    }
    envelopes = pa.table({name: pc.take(column, take) for name, column in columns.items()})
    no_headers = pa.MapArray.from_arrays(np.zeros(len(take) + 1, dtype=np.int32), pa.array([], pa.string()),
                                         pa.array([], pa.string()))
    envelopes = envelopes.append_column("headers", no_headers)
    return plain, envelopes.cast(pa.schema(schemas.ENVELOPE_FIELDS))


def _true(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column as a numpy mask, null counting as false."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _segments(texts: pa.Array, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """`texts[i][starts[i]:ends[i]]` for every i, in one copy: the slices and the gaps between them
    are consecutive elements over the texts' own bytes, and the slices are taken."""
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64)[texts.offset:texts.offset + len(texts) + 1]
    lengths = np.diff(offsets)
    starts = np.clip(starts, 0, lengths)
    ends = np.clip(ends, starts, lengths)
    bounds = np.empty(2 * len(texts), dtype=np.int64)
    bounds[0::2] = offsets[:-1] + starts
    bounds[1::2] = offsets[:-1] + ends
    pieces = pa.LargeStringArray.from_buffers(max(2 * len(texts) - 1, 0), pa.py_buffer(bounds), texts.buffers()[2])
    return pc.take(pieces, pa.array(np.arange(0, 2 * len(texts), 2, dtype=np.int64)))


def _compact(bodies: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each body without its whitespace outside strings, and each body with its strings overwritten
    by quotes (for the number check); exact for bodies without backslashes, by the parity of the
    quotes before each byte."""
    compact, masked = [], []
    for start in range(0, len(bodies), _CHUNK_ROWS):
        chunk = bodies.slice(start, _CHUNK_ROWS)
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64)[chunk.offset:chunk.offset + len(chunk) + 1]
        data = chunk.buffers()[2]
        raw = (np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8))
        raw = raw[offsets[0]:offsets[-1]]
        starts, lengths = offsets[:-1] - offsets[0], np.diff(offsets)
        quote = raw == 0x22
        parity = np.logical_xor.accumulate(quote) if len(raw) else quote
        # Each body counts its quotes from its own start (a malformed one must not shift the next).
        before = np.where(starts > 0, parity[np.maximum(starts - 1, 0)], False) if len(raw) else starts > 0
        inside = parity ^ np.repeat(before, lengths)
        blank = (raw == 0x20) | (raw == 0x09) | (raw == 0x0A) | (raw == 0x0D)
        compact.append(_select(raw, starts, lengths, ~(blank & ~inside)))
        relative = np.concatenate((starts, [len(raw)])).astype(np.int64)
        masked.append(pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts), [
            None, pa.py_buffer(relative), pa.py_buffer(np.where(inside, np.uint8(0x22), raw))]))
    if not compact:
        return pa.array([], pa.large_binary()), pa.array([], pa.large_binary())
    return pa.concat_arrays(compact), pa.concat_arrays(masked)


def _select(raw: np.ndarray, starts: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> pa.Array:
    """The kept bytes of each segment, as an array of segments."""
    # Counting the dropped bytes by position is far cheaper than summing a mask per segment.
    dropped = np.flatnonzero(~keep)
    kept_lengths = lengths - (np.searchsorted(dropped, starts + lengths) - np.searchsorted(dropped, starts))
    offsets = np.concatenate(([0], np.cumsum(kept_lengths))).astype(np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(starts),
                                            [None, pa.py_buffer(offsets), pa.py_buffer(raw[keep])])


def _text(value: str) -> pa.Scalar:
    return pa.scalar(value, pa.large_string())


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


def _read(texts: pa.Array, wanted: np.ndarray, schema: pa.Schema | None,
          accept: Callable[[pa.Table], bool] = lambda _: True) -> tuple[pa.Table, np.ndarray]:
    """Read the wanted texts as JSON Lines (a null row for the others) and which ones read.

    A chunk pyarrow refuses as a whole is halved until the lines it refuses are alone."""
    rows = np.flatnonzero(wanted)
    ok = np.zeros(len(texts), dtype=bool)
    pieces: list[tuple[np.ndarray, pa.Table]] = []
    pending = [rows] if len(rows) else []
    while pending:
        chunk = pending.pop()
        table = _read_chunk(pc.take(texts, pa.array(chunk)), schema)
        if table is not None and accept(table):
            ok[chunk] = True
            pieces.append((chunk, table))
        elif len(chunk) > 1:
            half = len(chunk) // 2
            pending += [chunk[half:], chunk[:half]]
    full = _scatter(len(texts), pieces, schema) if schema is not None else pa.table({})
    return full, ok


def _read_chunk(texts: pa.Array, schema: pa.Schema | None) -> pa.Table | None:
    joined = pc.binary_join_element_wise(texts, _text("\n"), _text("")).cast(pa.large_binary())
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64)[joined.offset:joined.offset + len(joined) + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    data = joined.buffers()[2]
    source = pa.py_buffer(memoryview(data)[start:end]) if data is not None else pa.py_buffer(b"")
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error" if schema else "infer")
    try:
        table = pj.read_json(io.BytesIO(source), parse_options=options,
                             # A block must hold a whole line; blocks are what the reader spreads over cores.
                             read_options=pj.ReadOptions(block_size=max(1 << 20, min(len(source) + 1, 16 << 20))))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table if table.num_rows == len(texts) else None


def _scatter(n: int, pieces: list[tuple[np.ndarray, pa.Table]], schema: pa.Schema) -> pa.Table:
    """The read rows back at their positions, null elsewhere."""
    if not pieces:
        return pa.table({name: pa.nulls(n, schema.field(name).type) for name in schema.names})
    order = np.concatenate([rows for rows, _ in pieces])
    table = pa.concat_tables([table.select(schema.names).cast(schema) for _, table in pieces])
    position = np.full(n, -1, dtype=np.int64)
    position[order] = np.arange(len(order))
    index = pa.array(position, mask=position < 0)
    return pa.table({name: pc.take(table[name], index).combine_chunks() for name in schema.names})


def _valid_bodies(wrapped: pa.Array, wanted: np.ndarray) -> np.ndarray:
    """Which `{"body": ...}` texts hold a body and nothing else, and that body one JSON value."""
    _, ok = _read(wrapped, wanted, None, accept=lambda table: table.column_names == ["body"])
    return ok


_PRINTABLE = np.zeros(256, dtype=np.uint8)
_PRINTABLE[[0x09, 0x0D, *range(0x20, 0x7F)]] = 1


def printable(texts: pa.Array) -> np.ndarray:
    """Which texts (string or binary) are one line of printable ASCII (tabs and CR allowed): the only
    lines the vectorised path looks at."""
    texts = texts.cast(pa.large_binary())
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64)[texts.offset:texts.offset + len(texts) + 1]
    data = texts.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    good = _PRINTABLE[raw]
    lengths = np.diff(offsets)
    ok = np.ones(len(texts), dtype=bool)
    solid = np.flatnonzero(lengths > 0)
    if len(solid):
        ok[solid] = np.minimum.reduceat(good, offsets[:-1][solid]) == 1
        # reduceat runs each segment up to the next start: the last one must stop at its own end.
        tail = offsets[:-1][solid[-1]]
        ok[solid[-1]] = bool(good[tail:offsets[-1]].min())
    return ok & _true(texts.is_valid())
