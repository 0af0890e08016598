"""The message envelope (SPEC section 4, a contract) and what a handler is given."""

from __future__ import annotations

import base64
import json
import math
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from poison_pipeline.domain.names import ConversationName, SentName

ENCODINGS = ("empty", "json", "xml", "text", "binary")
FIELDS = {
    "message_id", "conversation_id", "sequence_number", "message_type", "body", "body_base64",
    "encoding", "enqueued_at", "expires_at", "sender", "headers",
}
# The longest id, type or sender an envelope may carry, in characters.
TEXT_LIMIT = 256


class EnvelopeError(ValueError):
    """An envelope was refused; the message names the field and what is wrong with it."""


@dataclass(frozen=True)
class Envelope:
    message_id: str
    message_type: str
    body: bytes
    encoding: str
    enqueued_at: datetime
    conversation_id: str | None = None
    sequence_number: int | None = None
    expires_at: datetime | None = None
    sender: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Outgoing:
    """A message a handler sent to another queue, held until its attempt succeeds."""

    target: str
    message_id: str
    conversation_id: str
    sequence_number: int | None
    message_type: str
    body: bytes
    encoding: str
    headers: dict[str, str]
    lifetime_s: float | None


@dataclass(frozen=True)
class Message:
    """One delivery of an envelope to a handler, with its counts (WCF's operation context)."""

    envelope: Envelope
    queue: str
    abort_count: int
    # Moves as MSMQ counts them, one to a subqueue and one back from a retry subqueue (routing.py):
    # 2k in retry cycle k, so WCF's cycle is move_count // 2; odd in the poison queue.
    move_count: int
    cycle: int
    attempt: int
    # Lifetime totals, kept across redrives: failed attempts in every queue, and redrives by operators.
    total_abort_count: int = 0
    redrive_count: int = 0

    def __getattr__(self, name: str) -> Any:
        # Handlers read message.message_id, message.body...: delegate to the envelope.
        return getattr(self.envelope, name)

    outbox: list[Outgoing] = field(default_factory=list, compare=False)

    def json(self) -> Any:
        return json.loads(self.envelope.body)

    def send(
        self,
        to_queue: str,
        message_type: str,
        body: Any = None,
        *,
        encoding: str | None = None,
        conversation_id: str | None = None,
        sequence_number: int | None = None,
        headers: dict[str, str] | None = None,
        lifetime: timedelta | None = None,
    ) -> str:
        """Send a message to another application queue; it is released only if this attempt
        succeeds (an outbox). Returns its message id, derived from this queue's name and this
        message's id (domain/names.py) so that a redelivery sends the same ids and the receiver drops
        the copies.

        It goes on `conversation_id` (default: this message's conversation, else a new one named
        after this message) and waits in this queue's transmission queue until the target accepts
        it; past `lifetime` still undelivered, the conversation fails with error -8489.
        """
        if not isinstance(to_queue, str) or not to_queue:
            raise ValueError("send: to_queue must be the name of a declared application queue")
        if not isinstance(message_type, str) or not message_type:
            raise ValueError("send: message_type must be a non-empty string")
        if lifetime is not None and lifetime <= timedelta(0):
            raise ValueError("send: lifetime must be greater than zero")
        encoding = encoding or ("empty" if body is None else "json")
        if encoding not in ENCODINGS:
            raise ValueError(f"send: encoding {encoding!r} is not one of {', '.join(ENCODINGS)}")
        raw = body if isinstance(body, bytes) else _body({} if body is None else {"body": body}, encoding)
        # Named after the sender queue too: another queue's message with the same id sends others.
        message_id = str(SentName(self.queue, self.envelope.message_id, len(self.outbox) + 1))
        self.outbox.append(Outgoing(
            target=to_queue,
            message_id=message_id,
            conversation_id=conversation_id or self.envelope.conversation_id or
            str(ConversationName(self.queue, self.envelope.message_id)),
            sequence_number=sequence_number,
            message_type=message_type,
            body=raw,
            encoding=encoding,
            headers=dict(headers or {}),
            lifetime_s=lifetime.total_seconds() if lifetime else None,
        ))
        return message_id

    def text(self) -> str:
        return self.envelope.body.decode("utf-8")


def shown(value: Any, limit: int = 80) -> str:
    """A refused value as a refusal quotes it: its repr, cut short (an integer of thousands of digits
    has none)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else f"<a {type(value).__name__}>"
    return text if len(text) <= limit else f"{text[:limit - 5]}...{text[-1]}"


def _timestamp(record: dict[str, Any], name: str) -> datetime | None:
    value = record.get(name)
    if value is None:
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise EnvelopeError(f"{name}: {shown(value)} is not an ISO 8601 timestamp") from None
    else:
        raise EnvelopeError(f"{name}: {shown(value)} is not an ISO 8601 timestamp")
    try:
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC
        raise EnvelopeError(f"{name}: {shown(value)} is out of range in UTC (years 1 to 9999)") from None


def _storable(name: str, value: str) -> str:
    """`value`, unless it holds a lone surrogate (JSON can escape one, `\\ud800`): not Unicode text,
    so no UTF-8 column can store it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise EnvelopeError(f"{name}: has a lone surrogate ({value[error.start]!r} at character {error.start}), "
                            "which is not Unicode text and cannot be stored") from None
    return value


def _text(record: dict[str, Any], name: str, required: bool, limit: int = TEXT_LIMIT) -> str | None:
    value = record.get(name)
    if value is None or value == "":
        if required:
            raise EnvelopeError(f"{name}: required, and missing or empty")
        return None
    if not isinstance(value, str):
        raise EnvelopeError(f"{name}: {shown(value)} must be a string")
    if len(value) > limit:
        raise EnvelopeError(f"{name}: longer than {limit} characters")
    return _storable(name, value)


def _body(record: dict[str, Any], encoding: str) -> bytes:
    if "body" in record and "body_base64" in record:
        raise EnvelopeError("body: give either body or body_base64, not both")
    if "body_base64" in record:
        try:
            return base64.b64decode(record["body_base64"], validate=True)
        except (ValueError, TypeError):
            raise EnvelopeError("body_base64: not valid base64") from None
    value = record.get("body")
    if value is None:
        return b""
    if encoding == "json" and not isinstance(value, str):
        try:
            # NaN and infinities (a JSON reader's 1e400) are not JSON: refused, never stored as `Infinity`.
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as error:
            raise EnvelopeError(f"body: cannot be written as JSON ({type(error).__name__}: {error})") from None
    if not isinstance(value, str):
        raise EnvelopeError(f"body: a {encoding} body must be a string (or use body_base64)")
    return _storable("body", value).encode("utf-8")


def check_body(body: bytes, encoding: str, max_bytes: int) -> None:
    """Refuse a body that its encoding says cannot be what it is, or one that is too large."""
    if len(body) > max_bytes:
        raise EnvelopeError(f"body: {len(body)} bytes is over the queue's limit of {max_bytes}")
    if encoding == "empty":
        if body:
            raise EnvelopeError("body: encoding 'empty' must have no body")
        return
    if encoding == "binary":
        return
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise EnvelopeError(
            f"body: not valid UTF-8 at byte {error.start} for encoding {encoding!r} "
            "(send it as 'binary' with body_base64)"
        ) from None
    if encoding == "json":
        try:
            value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
        except json.JSONDecodeError as error:
            raise EnvelopeError(f"body: not valid JSON ({error})") from None
        except (ValueError, RecursionError) as error:
            raise EnvelopeError(f"body: not valid JSON ({type(error).__name__}: {error})") from None
        if "\\u" in text:  # only an escape spells a lone surrogate in UTF-8 text
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise EnvelopeError("body: a string in the JSON body has a lone surrogate (an escaped \\ud800 to "
                                    "\\udfff without its pair), which is not Unicode text") from None
    elif encoding == "xml":
        try:
            ElementTree.fromstring(text)
        except ElementTree.ParseError as error:
            raise EnvelopeError(f"body: not well-formed XML ({error})") from None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range (a 64-bit float)")
    return value


def parse_envelope(
    record: Any,
    now: datetime,
    time_to_live: timedelta | None = None,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> Envelope:
    """Validate one record (a decoded JSON object) into an Envelope, or raise EnvelopeError."""
    if not isinstance(record, dict):
        raise EnvelopeError(f"an envelope must be a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - FIELDS, key=str)
    if unknown:
        key = unknown[0]
        name = key if isinstance(key, str) and key.isprintable() and key else shown(key)
        raise EnvelopeError(f"{name}: not an envelope field (fields: {', '.join(sorted(FIELDS))})")
    message_id = _text(record, "message_id", required=True)
    message_type = _text(record, "message_type", required=True)
    # Without an encoding, a body is taken as JSON and no body as an empty message.
    has_body = record.get("body") is not None or "body_base64" in record
    # An empty encoding reads as none, as an empty optional text does; any other non-text is refused.
    encoding = record.get("encoding")
    encoding = encoding if encoding not in (None, "") else ("json" if has_body else "empty")
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise EnvelopeError(f"encoding: {shown(encoding)} is not one of {', '.join(ENCODINGS)}")
    body = _body(record, encoding)
    check_body(body, encoding, max_body_bytes)
    sequence = record.get("sequence_number")
    if sequence is not None and (isinstance(sequence, bool) or not isinstance(sequence, int)):
        raise EnvelopeError(f"sequence_number: {shown(sequence)} must be an integer")
    if sequence is not None and not -(2**63) <= sequence < 2**63:
        # The tables store it as a 64-bit integer: a larger one would fail the whole batch's commit.
        raise EnvelopeError(f"sequence_number: {shown(sequence)} is out of range (a 64-bit integer)")
    conversation_id = _text(record, "conversation_id", required=False)
    if sequence is not None and conversation_id is None:
        raise EnvelopeError("sequence_number: only meaningful with a conversation_id")
    headers = record.get("headers")
    headers = {} if headers is None else headers
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise EnvelopeError("headers: must be an object of string keys to string values")
    for key, value in headers.items():
        _storable("headers", key)
        _storable("headers", value)
    enqueued_at = _timestamp(record, "enqueued_at") or now
    expires_at = _timestamp(record, "expires_at")
    if expires_at is None and time_to_live is not None:
        try:
            expires_at = enqueued_at + time_to_live
        except OverflowError:
            raise EnvelopeError(f"enqueued_at: {enqueued_at.isoformat()} plus the queue's time_to_live "
                                f"({time_to_live}) is past the year 9999") from None
    return Envelope(
        message_id=message_id or "",
        message_type=message_type or "",
        body=body,
        encoding=encoding,
        enqueued_at=enqueued_at,
        conversation_id=conversation_id,
        sequence_number=sequence,
        expires_at=expires_at,
        sender=_text(record, "sender", required=False),
        headers=dict(headers),
    )
