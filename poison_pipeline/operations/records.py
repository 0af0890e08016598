"""Validating envelopes and appending them to a queue's inbound table as one batch.

Records that are plainly valid (texts, and dicts once written as JSON lines) are decoded together by
`operations.plain_envelopes`; every other record goes through `parse_envelope` one by one, which
alone refuses and words the refusal.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.envelope import Envelope, EnvelopeError, parse_envelope, shown
from poison_pipeline.domain.policy import Policy
from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.operations.jsonl import newlines, screen, split_data
from poison_pipeline.operations.plain_envelopes import joined, plain_lines
from poison_pipeline.storage import schemas
from poison_pipeline.storage.faults import StorageFailure
from poison_pipeline.storage.intake import append_enqueued, enqueued_batch_landed, opened_intake, settle_intake
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import LeaseFreeAppender

_SLICE_ROWS = 50_000
_ENVELOPE = pa.schema(schemas.ENVELOPE_FIELDS)


@dataclass(frozen=True)
class Refusal:
    line: int
    message_id: str | None
    error: str
    record: str


@dataclass
class EnqueueResult:
    accepted: int = 0
    batch_id: str | None = None
    refused: list[Refusal] = field(default_factory=list)


@dataclass(frozen=True)
class Parsed:
    """Envelopes read by the vectorised path: their line numbers and envelope columns."""

    lines: np.ndarray
    envelopes: pa.Table

    @staticmethod
    def none() -> Parsed:
        return Parsed(np.zeros(0, dtype=np.int64), _ENVELOPE.empty_table())


def envelope_table(envelopes: Sequence[Envelope]) -> pa.Table:
    rows = [{**{name: getattr(env, name) for name in _ENVELOPE.names}, "headers": list(env.headers.items())}
            for env in envelopes]
    return pa.Table.from_pylist(rows, schema=_ENVELOPE)


def waiting_rows(envelopes: pa.Table, batch_id: str, now: datetime) -> pa.Table:
    """Envelope columns as rows of a waiting table: fresh counts, due now."""
    n = envelopes.num_rows
    columns: dict[str, Any] = {name: envelopes[name] for name in _ENVELOPE.names}
    for name in ("abort_count", "total_abort_count", "move_count", "redrive_count"):
        columns[name] = pa.repeat(pa.scalar(0, pa.int32()), n)
    for name in ("due_at", "entered_at"):
        columns[name] = pa.repeat(pa.scalar(now, schemas.TS), n)
    columns["batch_id"] = pa.repeat(pa.scalar(batch_id, pa.string()), n)
    return pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in schemas.MESSAGE},
                    schema=schemas.MESSAGE)


def message_rows(envelopes: Iterable[Envelope], batch_id: str, now: datetime) -> pa.Table:
    """Envelopes as rows of a waiting table: fresh counts, due now."""
    return waiting_rows(envelope_table(list(envelopes)), batch_id, now)


def parse_texts(texts: pa.Array, lines: np.ndarray, policy: Policy, now: datetime) -> tuple[Parsed, np.ndarray]:
    """The vectorised path over texts (no newline in them) numbered `lines`: what it read, and which
    texts it left."""
    data, offsets = joined(texts)
    return parse_lines(data, offsets[:-1], offsets[1:] - 1, np.asarray(lines, dtype=np.int64), policy, now)


def parse_lines(data: pa.Buffer | bytes, starts: np.ndarray, ends: np.ndarray, lines: np.ndarray, policy: Policy,
                now: datetime) -> tuple[Parsed, np.ndarray]:
    """The vectorised path over the lines `data[starts[i]:ends[i]]`, each followed by a newline in
    `data` and numbered `lines[i]`: what it read, and which lines it left."""
    if len(starts) == 0:
        return _gathered([], lines)
    data = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    spans = _spans(len(starts))
    # numpy and Arrow's kernels release the GIL: big inputs are read in slices on every core.
    with ThreadPoolExecutor(min(os.cpu_count() or 1, len(spans))) as pool:
        parts = list(pool.map(lambda span: _plain(*_contiguous(data, starts[span[0]:span[1]], ends[span[0]:span[1]]),
                                                  policy, now), spans))
    return _gathered(parts, lines)


def parse_objects(records: list[Any], lines: np.ndarray, policy: Policy, now: datetime) -> tuple[Parsed, np.ndarray]:
    """The vectorised path over dicts, each written as the JSON line `_object_line` gives: what it
    read, and which dicts it left. Writing holds the GIL and reading mostly does not, so a slice is
    read while the next one is written."""
    def written(first: int, last: int) -> tuple[pa.Buffer, np.ndarray]:
        texts = [_object_line(record) for record in records[first:last]]
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)) + 1, out=offsets[1:])
        return pa.py_buffer(("\n".join(texts) + "\n").encode("ascii")), offsets

    if not records:
        return _gathered([], lines)
    spans = _spans(len(records))
    with ThreadPoolExecutor(min(os.cpu_count() or 1, len(spans))) as pool:
        futures = [pool.submit(_plain, *written(first, last), policy, now) for first, last in spans]
        parts = [future.result() for future in futures]
    return _gathered(parts, lines)


def _spans(count: int) -> list[tuple[int, int]]:
    # Slices of a bounded size, not one per core: their temporaries are reused from one slice to the
    # next instead of being fresh pages of hundreds of megabytes each (a 1,000,000-line file read in
    # two halves took 11-12 CPU seconds, in slices of 50,000 lines 7).
    bounds = np.linspace(0, count, max(1, count // _SLICE_ROWS) + 1).astype(int).tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _plain(data: pa.Buffer, offsets: np.ndarray, policy: Policy, now: datetime) -> tuple[np.ndarray, pa.Table]:
    return plain_lines(data, offsets, now, policy.time_to_live, policy.max_body_bytes)


def _gathered(parts: list[tuple[np.ndarray, pa.Table]], lines: np.ndarray) -> tuple[Parsed, np.ndarray]:
    if not parts:
        return Parsed.none(), np.zeros(0, dtype=bool)
    read_mask = np.concatenate([mask for mask, _ in parts])
    envelopes = pa.concat_tables([table for _, table in parts])
    return Parsed(lines[read_mask], envelopes), ~read_mask


def _contiguous(data: pa.Buffer, starts: np.ndarray, ends: np.ndarray) -> tuple[pa.Buffer, np.ndarray]:
    """The lines, each with its newline, end to end: the data itself when they already are (a file
    without blank lines), else one copy."""
    if np.array_equal(starts[1:], ends[:-1] + 1):
        return data, np.append(starts, ends[-1] + 1)
    bounds = np.empty(2 * len(starts), dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, ends + 1
    pieces = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * len(starts) - 1,
                                              [None, pa.py_buffer(bounds), data])
    lines = pc.take(pieces, pa.array(np.arange(0, 2 * len(starts), 2, dtype=np.int64)))
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    return lines.buffers()[2], offsets


def enqueue(
    declaration: Declaration,
    queue: str,
    records: Iterable[Any] | bytes | os.PathLike[str],
    now: datetime | None = None,
) -> EnqueueResult:
    """Validate each record (a JSON text or a decoded object) and append the valid ones to
    `queue`'s inbound table in one commit. `records` may also be a JSON Lines file, its path or its
    bytes: it is then read as `poison-pipeline enqueue` reads it (blank lines skipped, each refusal
    numbered with its line in the file).

    A refused record is reported with its position and the reason; it never blocks the others.
    """
    if isinstance(records, str):
        # Iterated, a string is its characters: every one would be refused as a record of its own.
        raise TypeError(f"records is one string ({shown(records, 200)}): pass a list of JSON texts, or a "
                        "JSON Lines file as a pathlib.Path or as bytes")
    now = now or datetime.now(UTC)
    if isinstance(records, os.PathLike):
        records = Path(records).read_bytes()
    if isinstance(records, bytes | bytearray | memoryview):
        return land_data(declaration, queue, bytes(records), now)[0]
    policy = declaration.queue(queue).policy
    records = records if isinstance(records, list) else list(records)
    if records and all(type(record) is dict for record in records):
        numbers = np.arange(1, len(records) + 1, dtype=np.int64)
        parsed, left = parse_objects(records, numbers, policy, now)
        others = [(number, records[number - 1]) for number in numbers[left].tolist()]
        return land(declaration, queue, parsed, others, lambda line: _raw(records[line - 1]), now)
    data = _ascii_lines(records)
    if data is not None:
        ends = newlines(np.frombuffer(data, dtype=np.uint8))
        numbers = np.arange(1, len(records) + 1, dtype=np.int64)
        parsed, left = parse_lines(data, np.concatenate(([0], ends[:-1] + 1)), ends, numbers, policy, now)
        others = [(number, records[number - 1]) for number in numbers[left].tolist()]
        return land(declaration, queue, parsed, others, lambda line: _raw(records[line - 1]), now)
    # Only printable ASCII lines can be plain: the others (and decoded objects) go per record.
    texts = [i for i, record in enumerate(records)
             if isinstance(record, str) and record.isascii() and "\n" not in record]
    chosen = [records[i] for i in texts]
    lengths = np.fromiter(map(len, chosen), dtype=np.int64, count=len(chosen))
    ends = np.cumsum(lengths + 1) - 1
    numbers = np.array(texts, dtype=np.int64) + 1
    parsed, left = parse_lines(("\n".join(chosen) + "\n").encode("ascii"), ends - lengths, ends, numbers,
                               policy, now)
    by_record = np.zeros(len(records), dtype=bool)
    by_record[numbers[~left] - 1] = True
    others = [(i + 1, records[i]) for i in np.flatnonzero(~by_record).tolist()]
    return land(declaration, queue, parsed, others, lambda line: _raw(records[line - 1]), now)


def _ascii_lines(records: list[Any]) -> bytes | None:
    """The records as lines end to end, each with its newline, when every one is an ASCII text
    without a newline (what producers hand over): one join and one encode, no work per record."""
    try:
        joined = "\n".join([*records, ""])
    except TypeError:  # not all texts
        return None
    if not joined.isascii() or joined.count("\n") != len(records):
        return None
    return joined.encode("ascii")


def _object_line(record: Any) -> str:
    """A dict as one JSON line, written as `parse_envelope` writes a body (compact, ASCII: no newline
    inside); `_LEFT` for anything else, or a dict JSON cannot write (a datetime, a cycle)."""
    if type(record) is not dict:
        return _LEFT
    try:
        return "".join(_C_ENCODE(record, 0)) if _C_ENCODE is not None else _ENCODER.encode(record)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return _LEFT


# A line the vectorised path never reads (it is not an object): its record is checked on its own.
_LEFT = "-"


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


# NaN is written (its line then left to the per-record path, which refuses it) so that one NaN does
# not send a whole call per record; no cycle check: a cycle raises RecursionError.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)
# The C encoder, built once: `JSONEncoder.encode` builds one per call, which costs as much as
# writing a small envelope. Given a dict, it returns the text as a list of one string.
_C_MAKE = getattr(json.encoder, "c_make_encoder", None)  # None without the C accelerator
_C_ENCODE = None if _C_MAKE is None else _C_MAKE(None, _refuse, json.encoder.encode_basestring_ascii, None, ":",
                                                 ",", False, False, True)


RawOf = Callable[[int], bytes]


def land_data(declaration: Declaration, queue: str, data: bytes, now: datetime
              ) -> tuple[EnqueueResult, int, RawOf]:
    """Enqueue the non-blank lines of a JSON Lines file's bytes, read where they lie: no Python
    object and no copy per line. Returns the result, the number of lines, and each line's bytes
    by its number (for the refusals)."""
    data, starts, ends, numbers = split_data(data)
    parsed, left = parse_lines(data, starts, ends, numbers, declaration.queue(queue).policy, now)

    def raw_of(number: int) -> bytes:
        i = int(np.searchsorted(numbers, number))
        return data[starts[i]:ends[i]]

    return land_lines(declaration, queue, parsed, numbers, left, raw_of, now), len(numbers), raw_of


def land_lines(declaration: Declaration, queue: str, parsed: Parsed, numbers: np.ndarray, left: np.ndarray,
               raw_of: RawOf, now: datetime) -> EnqueueResult:
    """`land` what the vectorised path read and the lines it left (`numbers[left]`), each given by
    `raw_of(number)`: a line that is not UTF-8 is refused here, the others are checked by `land`."""
    screened: list[Refusal] = []
    others: list[tuple[int, Any]] = []
    for number in numbers[left].tolist():
        raw = raw_of(number)
        text, problem = screen(raw)
        if text is None:
            screened.append(Refusal(number, None, problem or "refused", raw[:1000].decode("utf-8", "replace")))
        else:
            others.append((number, text))
    texts = dict(others)
    result = land(declaration, queue, parsed, others,
                  lambda number: texts.get(number) or raw_of(number)[:4000].decode("utf-8", "replace"), now)
    if screened:
        result.refused = sorted(result.refused + screened, key=lambda refusal: refusal.line)
    return result


def land(declaration: Declaration, queue: str, parsed: Parsed, others: list[tuple[int, Any]],
         raw_of: Any, now: datetime) -> EnqueueResult:
    """Check `others` (numbered records) one by one, refuse repeated ids, and append what is left
    to the inbound table in one commit. `raw_of(line)` is the record as text, for refusals."""
    policy = declaration.queue(queue).policy
    result = EnqueueResult()
    envelopes: list[Envelope] = []
    numbers: list[int] = []
    for line, record in others:
        try:
            record = _decode(record)
            envelope = parse_envelope(record, now, policy.time_to_live, policy.max_body_bytes)
        except EnvelopeError as error:
            message_id = record.get("message_id") if isinstance(record, dict) else None
            result.refused.append(Refusal(line, message_id, str(error), raw_of(line)[:1000]))
            continue
        envelopes.append(envelope)
        numbers.append(line)
    table = pa.concat_tables([parsed.envelopes, envelope_table(envelopes)])
    lines = np.concatenate([parsed.lines, np.array(numbers, dtype=np.int64)])
    if np.any(np.diff(lines) < 0):  # the vectorised rows alone are in order already: no copy
        order = np.argsort(lines, kind="stable")
        table, lines = table.take(pa.array(order)), lines[order]
    keep = _first_of_each(table["message_id"])
    for position in np.flatnonzero(~keep).tolist():
        line = int(lines[position])
        message_id = table["message_id"][position].as_py()
        repeated = f"message_id: {message_id!r} appears twice in this batch"
        result.refused.append(Refusal(line, message_id, repeated, raw_of(line)[:1000]))
    result.refused.sort(key=lambda refusal: refusal.line)
    accepted = table if keep.all() else table.filter(pa.array(keep))  # a filter copies every body
    if accepted.num_rows:
        tables = QueueTables.of(declaration, queue)
        # Only the two tables an enqueue writes are opened; the others are the cycle's to create
        # (it ensures them all), unless inbound itself is missing: then every table is created here.
        inbound = tables.open_created(INBOUND)
        appender = LeaseFreeAppender(tables)
        intake = opened_intake(appender, now)
        settle_intake(appender)
        result.batch_id = f"enq-{uuid.uuid4().hex}"
        try:
            append_enqueued(tables, waiting_rows(accepted, result.batch_id, now), result.batch_id, now,
                            inbound, intake)
        except StorageFailure as failure:
            raise failure.meaning(_after_failure(tables, result.batch_id, accepted.num_rows)) from failure.__cause__
        result.accepted = accepted.num_rows
    return result


def _after_failure(tables: QueueTables, batch_id: str, messages: int) -> str:
    """What a failed enqueue means for its messages: in the queue or not, by the inbound log."""
    try:
        landed = enqueued_batch_landed(tables, batch_id)
    except Exception:  # noqa: BLE001 - the storage may not even be readable now
        landed = None
    if landed:
        return (f"The {messages} message(s) are in queue {tables.queue!r} (batch {batch_id}); only their count in "
                "the intake ledger is missing, and the next enqueue or cycle of the queue records it: do not "
                "enqueue them again")
    if landed is None:
        return (f"Whether the {messages} message(s) reached queue {tables.queue!r} (batch {batch_id}) could not be "
                "read back; `poison-pipeline status` says once the storage answers. Enqueuing them again is safe: "
                "a cycle delivers a repeated message id once and records the copy as a duplicate")
    return f"Nothing was enqueued into queue {tables.queue!r}: enqueue the {messages} message(s) again"


def _raw(record: Any) -> str:
    """The record as a refusal quotes it."""
    if isinstance(record, str):
        return record
    try:
        return json.dumps(record, default=str)
    except (TypeError, ValueError, RecursionError):  # keys JSON cannot have, huge integers, deep nesting
        return shown(record, 1000)


def _decode(record: Any) -> Any:
    if not isinstance(record, str):
        return record
    try:
        return json.loads(record)
    except json.JSONDecodeError as error:
        raise EnvelopeError(f"not valid JSON ({error})") from None
    except (ValueError, RecursionError) as error:  # an integer of thousands of digits, nesting too deep
        raise EnvelopeError(f"not valid JSON ({type(error).__name__}: {error})") from None


def _first_of_each(ids: pa.ChunkedArray) -> np.ndarray:
    """Which rows (in line order) are the first of their id; the others are repeats."""
    encoded = pc.dictionary_encode(ids.combine_chunks())
    if len(encoded.dictionary) == len(encoded):
        return np.ones(len(encoded), dtype=bool)
    # Codes are given in order of first appearance: a row is first when its code is a new highest.
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    before = np.concatenate(([-1], np.maximum.accumulate(codes)[:-1]))
    return codes > before
