"""`inspect`: where a message is, its counts, its body and its whole attempt history, changing nothing.

This is Service Broker's receive-and-roll-back done right: it only reads (delta-rs datasets filtered
on `message_id`, which the file statistics let skip most files), so no count moves and no table
gets a new version. A body is decoded for display and never evaluated or unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED, QUARANTINE
from poison_pipeline.operations.status import format_time
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables

# Enough to read any realistic body; beyond it an operator wants a file, not a terminal.
DISPLAY_LIMIT = 64 * 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class RenderedBody:
    shown_as: str
    text: str
    size: int | None
    note: str | None = None


@dataclass(frozen=True)
class ErrorView:
    type: str | None
    message: str | None
    signature: str | None
    stack: str | None


@dataclass(frozen=True)
class Location:
    queue: str
    table: str
    abort_count: int | None
    total_abort_count: int | None
    move_count: int | None
    entered_at: datetime | None
    due_at: datetime | None
    batch_id: str | None
    reason: str | None
    disposition: str | None
    from_table: str | None
    arrived_at: datetime | None
    last_error: ErrorView | None


@dataclass(frozen=True)
class EnvelopeView:
    message_type: str | None
    conversation_id: str | None
    sequence_number: int | None
    encoding: str | None
    enqueued_at: datetime | None
    expires_at: datetime | None
    sender: str | None
    headers: dict[str, str]
    body: RenderedBody
    raw_body: bytes | None


@dataclass(frozen=True)
class AttemptView:
    queue: str
    table: str
    cycle: int
    cycle_seq: int | None
    attempt: int
    started_at: datetime | None
    duration_ms: float | None
    outcome: str
    error: ErrorView | None
    run_id: str | None


@dataclass(frozen=True)
class Inspection:
    message_id: str
    locations: tuple[Location, ...]
    envelope: EnvelopeView
    attempts: tuple[AttemptView, ...]


def inspect_message(declaration: Declaration, message_id: str) -> Inspection | None:
    """Find `message_id` in every queue's waiting tables, dead-letter, quarantine and processed
    ledger; None when no table holds it."""
    locations: list[Location] = []
    bodies: list[dict[str, Any]] = []
    attempts: list[AttemptView] = []
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        for table in (*tables.waiting, DEAD_LETTER, QUARANTINE, PROCESSED):
            for row in _rows(tables, table, message_id):
                locations.append(_location(queue, table, row))
                bodies.append(row)
        attempts.extend(_attempt(queue, row) for row in _rows(tables, ATTEMPTS, message_id))
    if not locations and not attempts:
        return None
    attempts.sort(key=lambda a: (a.started_at is None, a.started_at, a.cycle_seq or 0, a.attempt))
    return Inspection(message_id, tuple(locations), _envelope(bodies), tuple(attempts))


def _rows(tables: QueueTables, table: str, message_id: str) -> list[dict[str, Any]]:
    if not tables.exists(table):
        return []
    dataset = tables.open(table).to_pyarrow_dataset()
    found: pa.Table = dataset.to_table(filter=pads.field("message_id") == message_id)
    return found.to_pylist()


def _error(row: dict[str, Any], prefix: str) -> ErrorView | None:
    kind = row.get(f"{prefix}_type")
    if kind is None and row.get(f"{prefix}_message") is None:
        return None
    return ErrorView(kind, row.get(f"{prefix}_message"), row.get(f"{prefix}_signature"),
                     row.get(f"{prefix}_stack"))


def _location(queue: str, table: str, row: dict[str, Any]) -> Location:
    arrived = row.get("dead_lettered_at") or row.get("quarantined_at") or row.get("at")
    return Location(
        queue=queue,
        table=table,
        abort_count=row.get("abort_count"),
        total_abort_count=row.get("total_abort_count"),
        move_count=row.get("move_count"),
        entered_at=row.get("entered_at"),
        due_at=row.get("due_at"),
        batch_id=row.get("batch_id"),
        reason=row.get("reason"),
        disposition=row.get("disposition"),
        from_table=row.get("from_table"),
        arrived_at=arrived,
        last_error=_error(row, "last_error"),
    )


def _attempt(queue: str, row: dict[str, Any]) -> AttemptView:
    return AttemptView(
        queue=queue,
        table=row["table"],
        cycle=row["cycle"],
        cycle_seq=row.get("cycle_seq"),
        attempt=row["attempt"],
        started_at=row.get("started_at"),
        duration_ms=row.get("duration_ms"),
        outcome=row["outcome"],
        error=_error(row, "error"),
        run_id=row.get("run_id"),
    )


def _envelope(rows: Sequence[dict[str, Any]]) -> EnvelopeView:
    # The processed ledger keeps no body: prefer a row from a table that does.
    with_body = [r for r in rows if "body" in r]
    row = with_body[0] if with_body else (rows[0] if rows else {})
    if with_body:
        raw = row["body"] or b""
        body = render_body(raw, row.get("encoding"))
    else:
        raw = None
        body = RenderedBody("absent", "(not kept: the processed ledger keeps no bodies)", None)
    return EnvelopeView(
        message_type=row.get("message_type"),
        conversation_id=row.get("conversation_id"),
        sequence_number=row.get("sequence_number"),
        encoding=row.get("encoding"),
        enqueued_at=row.get("enqueued_at"),
        expires_at=row.get("expires_at"),
        sender=row.get("sender"),
        headers=dict(row.get("headers") or []),
        body=body,
        raw_body=raw,
    )


def render_body(body: bytes, encoding: str | None, limit: int = DISPLAY_LIMIT) -> RenderedBody:
    """The body as an operator should see it; whatever fails to decode is shown as hex."""
    size = len(body)
    if encoding == "binary":
        return _hex(body, limit)
    if encoding == "empty":
        if not body:
            return RenderedBody("empty", "(empty)", 0)
        return _hex(body, limit, f"encoding 'empty' yet {size} bytes of body")
    if encoding not in ("json", "xml", "text"):
        return _hex(body, limit, f"encoding {encoding!r} is not one this pipeline writes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        return _hex(body, limit, f"not valid UTF-8 at byte {error.start}")
    if encoding == "json":
        pretty, problem = _pretty_json(text)
        if pretty is not None:
            return _clip("json", _printable(pretty), size, limit)
        return _clip("text", _printable(text), size, limit, f"not valid JSON ({problem}); shown as text")
    if not text:
        return RenderedBody(encoding, "(empty)", 0)
    return _clip(encoding, _printable(text), size, limit)


def _pretty_json(text: str) -> tuple[str | None, str | None]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            # Pretty-printing would silently keep only the last value of a repeated key.
            raise ValueError("a key appears twice in one object")
        return dict(pairs)

    try:
        value = json.loads(text, object_pairs_hook=no_duplicates)
        return json.dumps(value, indent=2, ensure_ascii=False), None
    except (ValueError, RecursionError) as error:
        return None, str(error) or type(error).__name__


def _printable(text: str) -> str:
    # Control characters could drive the operator's terminal (escape sequences): show them escaped.
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _clip(shown_as: str, text: str, size: int, limit: int, note: str | None = None) -> RenderedBody:
    if len(text) > limit:
        cut = f"showing the first {limit} of {len(text)} characters"
        return RenderedBody(shown_as, text[:limit], size, f"{note}; {cut}" if note else cut)
    return RenderedBody(shown_as, text, size, note)


def _hex(body: bytes, limit: int, problem: str | None = None) -> RenderedBody:
    shown = body[:limit]
    lines = []
    for offset in range(0, len(shown), 16):
        chunk = shown[offset:offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk[:8]) + "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        ascii_ = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<49} |{ascii_}|")
    notes = [f"{problem}; shown as hex"] if problem else []
    if len(body) > limit:
        notes.append(f"showing the first {limit} of {len(body)} bytes")
    return RenderedBody("hex", "\n".join(lines) or "(empty)", len(body), "; ".join(notes) or None)


def _error_text(error: ErrorView | None, stacks: bool, indent: str) -> list[str]:
    if error is None:
        return []
    lines = [f"{indent}{error.type}: {error.message}  [signature {error.signature}]"]
    if stacks and error.stack:
        lines.extend(f"{indent}  {line}" for line in error.stack.rstrip().splitlines())
    return lines


def format_inspection(found: Inspection, now: datetime, stacks: bool = False) -> str:
    env = found.envelope
    lines = [f"message {found.message_id}"]
    if len(found.locations) > 1:
        lines.append(f"  ! found in {len(found.locations)} places (expected one)")
    for place in found.locations:
        lines.append(f"  in {place.queue}/{place.table}" + _place_detail(place, now))
        counts = [f"{name} {value}" for name, value in (
            ("abort_count", place.abort_count), ("total_abort_count", place.total_abort_count),
            ("move_count", place.move_count)) if value is not None]
        if counts:
            lines.append("    " + ", ".join(counts))
        if place.last_error is not None:
            lines.append("    last error:")
            lines.extend(_error_text(place.last_error, stacks, "      "))
    if not found.locations:
        lines.append("  in no table (only its attempts are recorded)")
    lines.extend(f"  {name} {value}" for name, value in (
        ("message_type", env.message_type), ("encoding", env.encoding),
        ("conversation_id", env.conversation_id), ("sequence_number", env.sequence_number),
        ("sender", env.sender), ("enqueued_at", env.enqueued_at and format_time(env.enqueued_at)),
        ("expires_at", env.expires_at and format_time(env.expires_at))) if value is not None)
    if env.headers:
        lines.append("  headers " + ", ".join(f"{k}={_printable(v)}" for k, v in env.headers.items()))
    size = "" if env.body.size is None else f" ({env.body.size} bytes, shown as {env.body.shown_as})"
    lines.append(f"  body{size}:")
    if env.body.note:
        lines.append(f"    note: {env.body.note}")
    lines.extend(f"    {line}" for line in env.body.text.splitlines() or [""])
    lines.append(f"  attempts ({len(found.attempts)}):")
    for a in found.attempts:
        lines.append(
            f"    {format_time(a.started_at)}  {a.queue}/{a.table} cycle {a.cycle} attempt {a.attempt}"
            f"  {a.outcome}" + (f"  {a.duration_ms:.0f}ms" if a.duration_ms is not None else "")
        )
        lines.extend(_error_text(a.error, stacks, "      "))
    return "\n".join(lines)


def _place_detail(place: Location, now: datetime) -> str:
    if place.table == PROCESSED:
        return f": {place.disposition} at {format_time(place.arrived_at)} (from {place.from_table})"
    if place.table in (DEAD_LETTER, QUARANTINE):
        verb = "dead-lettered" if place.table == DEAD_LETTER else "quarantined"
        return f": {verb} ({place.reason}) at {format_time(place.arrived_at)} from {place.from_table}"
    if place.due_at is None:
        return ": waiting"
    when = "due now" if place.due_at <= now else f"due at {format_time(place.due_at)}"
    return f": waiting since {format_time(place.entered_at)}, {when}"
