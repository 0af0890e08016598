"""`inspect`: where a message is, its counts, its body and its whole attempt history, changing nothing.

This is Service Broker's receive-and-roll-back done right: it only reads (delta-rs datasets filtered
on `message_id`, which the file statistics let skip most files), so no count moves and no table
gets a new version. A body is decoded for display and never evaluated or unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pyarrow.dataset as pads
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED, QUARANTINE
from poison_pipeline.storage.tables import ARCHIVED, ATTEMPTS, EDITS, QueueTables

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
    # Archived (`archive`): when, and by which action; the row stays here, left out of groups.
    archived_at: datetime | None = None
    archived_by: str | None = None


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
    # After the cycle's last attempt, when the message moved to a retry subqueue: the delay computed
    # before that retry cycle, in seconds.
    retry_delay_s: float | None = None


@dataclass(frozen=True)
class EditView:
    """An operator's edit of the message (`edit`): the original body is kept here."""

    edit_id: str
    queue: str
    source_table: str
    actor: str
    at: datetime
    encoding: str | None
    original_body: bytes
    new_body: bytes
    original_headers: dict[str, str]
    new_headers: dict[str, str]


@dataclass(frozen=True)
class Inspection:
    message_id: str
    locations: tuple[Location, ...]
    envelope: EnvelopeView
    attempts: tuple[AttemptView, ...]
    edits: tuple[EditView, ...] = ()
    # With `as_of`: the point in time or the table version shown (Delta time travel), else None.
    as_of: str | None = None


class InspectError(ValueError):
    """What the search was asked for cannot be searched: a table the queues do not have, or a
    time-travel point a table cannot be read at."""


class AsOfError(InspectError):
    """A time-travel point a table cannot be read at (no such version, or before the table existed)."""


AsOf = int | datetime | None


def inspect_message(declaration: Declaration, message_id: str, as_of: AsOf = None,
                    queue: str | None = None, table: str | None = None) -> Inspection | None:
    """Find `message_id` in every queue's waiting tables, dead-letter, quarantine and processed
    ledger; None when no table holds it. With `as_of` (a table version, which needs `table`, or a
    time), each table is read as it was then (Delta time travel); tables that did not exist yet
    are skipped. `queue` and `table` narrow the search."""
    if isinstance(as_of, int) and table is None:
        raise AsOfError("--as-of VERSION needs --table: each table has its own versions")
    names = [queue] if queue else list(declaration.queues)
    if table is not None:
        _check_table(declaration, names, table)
    locations: list[Location] = []
    bodies: list[dict[str, Any]] = []
    attempts: list[AttemptView] = []
    edits: list[EditView] = []
    for name in names:
        tables = QueueTables.of(declaration, name)
        for place in (*tables.waiting, DEAD_LETTER, QUARANTINE, PROCESSED):
            if table is not None and place != table:
                continue
            # A version is its own table's, not the markers': as of one, archiving is not shown.
            marked = [] if isinstance(as_of, int) else _rows(tables, ARCHIVED, message_id, as_of)
            marks = {(m["from_table"], m["batch_id"]): m for m in marked}
            for row in _rows(tables, place, message_id, as_of):
                mark = marks.get((place, row.get("batch_id"))) or {}
                locations.append(replace(_location(name, place, row), archived_at=mark.get("archived_at"),
                                         archived_by=mark.get("action_id")))
                bodies.append(row)
        if table is None or table == ATTEMPTS:
            attempts.extend(_attempt(name, row) for row in _rows(tables, ATTEMPTS, message_id, as_of))
        if as_of is None:
            edits.extend(_edit(row) for row in _rows(tables, EDITS, message_id))
    if not locations and not attempts and not edits:
        return None
    attempts.sort(key=lambda a: (a.started_at is None, a.started_at, a.cycle_seq or 0, a.attempt))
    edits.sort(key=lambda e: (e.at, e.edit_id))
    shown = None if as_of is None else (f"version {as_of} of {table}" if isinstance(as_of, int)
                                        else as_of.isoformat())
    return Inspection(message_id, tuple(locations), _envelope(bodies), tuple(attempts), tuple(edits), shown)


def _check_table(declaration: Declaration, queues: list[str], table: str) -> None:
    searched = {place for name in queues
                for place in (*QueueTables.of(declaration, name).waiting, DEAD_LETTER, QUARANTINE, PROCESSED)}
    searched.add(ATTEMPTS)
    if table not in searched:
        raise InspectError(f"table {table!r} is not one the message can be in; choose one of "
                           f"{', '.join(sorted(searched))}")


def _at(tables: QueueTables, table: str, as_of: AsOf) -> DeltaTable | None:
    if isinstance(as_of, int):
        latest = tables.open(table).version()
        missing = AsOfError(f"--as-of {as_of}: {tables.queue}/{table} has versions 0 to {latest} "
                            "(older ones may have been vacuumed)")
        # delta-rs looks for every commit up to the version asked for: one far past the latest
        # would take hours to be found missing.
        if as_of > latest:
            raise missing
        try:
            return DeltaTable(tables.uri(table), version=as_of, storage_options=tables.storage_options)
        except DeltaError:
            raise missing from None
    target = tables.open(table)
    if as_of is not None:
        try:
            target.load_as_version(as_of)
        except DeltaError:
            return None  # the table did not exist yet then
    return target


def _rows(tables: QueueTables, table: str, message_id: str, as_of: AsOf = None) -> list[dict[str, Any]]:
    if not tables.exists(table):
        return []
    target = _at(tables, table, as_of)
    if target is None:
        return []
    found: list[dict[str, Any]] = target.to_pyarrow_dataset().to_table(
        filter=pads.field("message_id") == message_id).to_pylist()
    return found


def _edit(row: dict[str, Any]) -> EditView:
    return EditView(row["edit_id"], row["queue"], row["source_table"], row["actor"], row["at"], row["encoding"],
                    row["original_body"], row["new_body"], dict(row["original_headers"] or []),
                    dict(row["new_headers"] or []))


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
        retry_delay_s=None if row.get("retry_delay_ms") is None else row["retry_delay_ms"] / 1000,
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
            return _clip("json", printable(pretty), size, limit)
        return _clip("text", printable(text), size, limit, f"not valid JSON ({problem}); shown as text")
    if not text:
        return RenderedBody(encoding, "(empty)", 0)
    return _clip(encoding, printable(text), size, limit)


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


def printable(text: str) -> str:
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
