"""`edit`: replace a failed message's body (and headers) and redrive that one message.

The message is found in its queue's poison, dead_letter or quarantine table. The new body is checked
against the message's encoding and the queue's `max_body_bytes` before anything is written. Then,
under the queue's lease:

1. the edit is recorded `planned` in the actions ledger (its id is the edit id);
2. one row is appended to the queue's `edits` table (who, when, original and new body and headers),
   under the app transaction of the edit id, so a replay never writes it twice;
3. the message is redriven (operations/redrive.py, one code path for moving messages) with the new
   body and headers, under the redrive id `<edit id>--redrive`: its plan, appends and removal are
   resumable as any redrive's;
4. the edit is recorded `done`.

An edit has an id: given (`--id`), or new at every invocation, so the same edit run twice is two
edits (the second finds the message sent back already and refuses). Killed at any step and run
again with its id, it completes without writing anything twice, and its redrive sends the message
only if it is still where the edit found it; run again after it completed, it changes nothing. An
id another queue's actions ledger records is refused. The original body stays in `edits`, readable through
`inspect` and `history`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

import pyarrow as pa
import pyarrow.dataset as pads
from pydantic import Field, field_validator, model_validator

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.envelope import EnvelopeError, check_body
from poison_pipeline.domain.names import ActionName, AppTransaction
from poison_pipeline.domain.paths import action_id_part
from poison_pipeline.domain.routing import FAILURE_TABLES, INBOUND
from poison_pipeline.operations.actions import (
    ABANDONED,
    DONE,
    Action,
    Recorded,
    committed,
    default_actor,
    find_action,
    new_action_id,
    operator_writer,
    reused_id,
)
from poison_pipeline.operations.redrive import Replacement, redrive_table
from poison_pipeline.operations.requests import ActionContext, ActionId, FailureTable, Request, not_blank
from poison_pipeline.operations.selection import Selection
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import EDITS, QueueTables
from poison_pipeline.storage.writer import QueueWriter


class EditError(ValueError):
    """An edit refused as asked (a body its encoding cannot be, a bad header, an ambiguous message);
    the message names the problem. Nothing was written."""


class EditNotFound(LookupError):  # noqa: N818 - the name says what the operator sees
    """The message is in no poison, dead_letter or quarantine table (or in none of the queue given)."""


@dataclass
class EditResult:
    edit_id: str
    message_id: str
    queue: str
    source: str
    redrive_id: str
    actor: str
    encoding: str | None
    original_body: bytes | None
    new_body: bytes
    original_headers: dict[str, str] = field(default_factory=dict)
    new_headers: dict[str, str] = field(default_factory=dict)
    moved: int = 0
    already_done: bool = False  # this edit id completed before: nothing changed now
    action_id: str | None = None
    abandoned: bool = False  # with already_done: closed by a cycle, killed before it recorded the new body


class EditOptions(Request):
    """What an edit takes besides where to look: the run config of a queue's edit job in Dagster."""

    message_id: str = Field(description="The failed message's message_id.")
    body: str = Field(description="The new body: text, or base64 with encoding base64 (binary bodies).")
    encoding: str = Field(default="utf-8", description="How `body` is written: utf-8 or base64.")
    headers: dict[str, str] = Field(default_factory=dict, description="Headers set; the others are kept.")
    source: FailureTable | None = Field(default=None, description="Only look in this table: poison, "
                                        "dead_letter or quarantine (a message in several must name one).")
    id: ActionId = Field(default=None, description="The edit's id; default: a new one. Run again with it, "
                         "an interrupted edit completes the message and body it recorded.")

    @field_validator("message_id")
    @classmethod
    def _message_id(cls, value: str) -> str:
        return not_blank(value) or value

    @field_validator("encoding")
    @classmethod
    def _encoding(cls, value: str) -> str:
        if value not in ("utf-8", "base64"):
            raise ValueError(f"{value!r}: choose utf-8 or base64")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.strip():
                raise ValueError(f"{key!r}: a header name cannot be empty")
        return value

    @model_validator(mode="after")
    def _decodable(self) -> Self:
        self.body_bytes()
        return self

    def body_bytes(self) -> bytes:
        if self.encoding == "utf-8":
            return self.body.encode("utf-8")
        try:
            return base64.b64decode(self.body, validate=True)
        except binascii.Error as error:
            raise ValueError(f"the body is not base64 ({error}), as encoding 'base64' says") from None


class EditRequest(EditOptions):
    """An edit: a failed message's new body and headers, and the message sent back to its inbound."""

    queue: str | None = Field(default=None, description="Only look in this queue.")


def edit(declaration: Declaration, request: EditRequest, context: ActionContext | None = None) -> EditResult:
    """Replace the body of a failed message (and set headers, the others kept) and send it back to its
    queue's inbound. Raises EditError (a request the lake refuses) or EditNotFound before writing."""
    context = context or ActionContext()
    return edit_message(declaration, request.message_id, request.body_bytes(), request.headers,
                        queue=request.queue, source=request.source, edit_id=request.id, actor=context.actor,
                        run_id=context.run_id, now=context.now)


def _failed_copies(declaration: Declaration, message_id: str, queue: str | None,
                   source: str | None) -> list[tuple[str, str, dict[str, Any]]]:
    found = []
    for name in [queue] if queue else list(declaration.queues):
        tables = QueueTables.of(declaration, name)
        for table in [source] if source else FAILURE_TABLES:
            found += [(name, table, row) for row in tables.message_rows(table, message_id)]
    return found


def _recorded_edit(declaration: Declaration, edit_id: str, queue: str | None) -> tuple[str, Any] | None:
    for name in [queue] if queue else list(declaration.queues):
        action = find_action(QueueTables.of(declaration, name), edit_id)
        if action is not None and action.kind != "edit":
            raise EditError(reused_id(declaration, edit_id, name, "edit") or edit_id)
        if action is not None:
            return name, action
    return None


def edit_message(declaration: Declaration, message_id: str, body: bytes, headers: dict[str, str] | None = None,
                 *, queue: str | None = None, source: str | None = None, edit_id: str | None = None,
                 actor: str | None = None, run_id: str = "manual", now: datetime | None = None,
                 within: QueueWriter | None = None) -> EditResult:
    """Replace the body of failed message `message_id` (and set `headers`, kept otherwise) and send it
    back to its queue's inbound: a validated request's edit, or an interrupted one's completion
    (`within`: the completing holder's writer)."""
    given = dict(headers or {})
    if queue is not None and queue not in declaration.queues:
        raise EditError(f"no queue {queue!r} is declared; declared: {', '.join(declaration.queues)}")
    given_id = action_id_part(edit_id, EditError)
    if given_id is not None and queue is not None and \
            (why := reused_id(declaration, given_id, queue, "edit")) is not None:
        raise EditError(why)
    edit_id = given_id or new_action_id("edit")
    actor = actor or default_actor()
    copies = _failed_copies(declaration, message_id, queue, source)
    recorded = _recorded_edit(declaration, edit_id, queue)
    if recorded is not None:
        name, action = recorded
        return _resume_or_done(declaration, name, action, message_id, body, given, actor, run_id, now, within)
    if not copies:
        raise EditNotFound(_not_found(declaration, message_id, queue, source))
    if len(copies) > 1:
        where = ", ".join(f"{q}/{t}" for q, t, _ in copies)
        raise EditError(f"message {message_id!r} is in {len(copies)} failure tables ({where}): "
                        "name one with --queue and --from")
    name, table, row = copies[0]
    _validate(declaration, name, message_id, body, row["encoding"])
    new_headers = {**dict(row.get("headers") or []), **given}
    probe = redrive_table(declaration, name, table, Selection(ids=(message_id,)), dry_run=True, force=True,
                          redrive_id=str(ActionName.parse(edit_id).edit_redrive()),
                          replace={message_id: _replacement(body, new_headers)})
    if probe.moved == 0:
        raise EditError(f"message {message_id!r} was already processed by queue {name!r} (its processed "
                        f"ledger): the copy in {name}/{table} is not sent back")
    return _run(declaration, name, table, message_id, body, given, edit_id, actor, run_id, now, within)


def _replacement(body: bytes, headers: dict[str, str]) -> Replacement:
    return Replacement(body, tuple(sorted(headers.items())))


def _validate(declaration: Declaration, queue: str, message_id: str, body: bytes, encoding: str | None) -> None:
    limit = declaration.queue(queue).policy.max_body_bytes
    try:
        check_body(body, encoding or "empty", limit)
    except EnvelopeError as error:
        raise EditError(f"message {message_id!r} has encoding {encoding!r}: the new {error}") from None


def _not_found(declaration: Declaration, message_id: str, queue: str | None, source: str | None) -> str:
    from poison_pipeline.operations.inspect_message import inspect_message  # reads every table: when needed

    where = f"{queue}/{source or 'poison, dead_letter or quarantine'}" if queue else \
        f"the poison, dead_letter or quarantine table of queues {', '.join(declaration.queues)}"
    found = inspect_message(declaration, message_id)
    if found is None or not found.locations:
        return f"message {message_id!r} is not in {where}, nor anywhere else"
    now = ", ".join(f"{p.queue}/{p.table}" for p in found.locations)
    return f"message {message_id!r} is not in {where} (it is in {now}): only a failed message can be edited"


def _resume_or_done(declaration: Declaration, queue: str, action: Any, message_id: str, body: bytes,
                    given: dict[str, str], actor: str, run_id: str, now: datetime | None,
                    within: QueueWriter | None) -> EditResult:
    source = action.arguments["from"]
    if action.state in (DONE, ABANDONED):
        recorded = edit_row(QueueTables.of(declaration, queue), action.action_id)
        # What the edit did, not what this call asked.
        message_id = action.arguments.get("message_id", message_id)
        body = recorded["new_body"] if recorded is not None else body
        result = _result(action.action_id, queue, source, message_id, body, recorded, action.actor)
        result.already_done, result.action_id = True, action.action_id
        result.abandoned = action.state == ABANDONED
        return result
    return _run(declaration, queue, source, message_id, body, given, action.action_id, actor, run_id, now, within)


def edit_row(tables: QueueTables, edit_id: str) -> dict[str, Any] | None:
    if not tables.exists(EDITS):
        return None
    rows = tables.open(EDITS).to_pyarrow_dataset().to_table(filter=pads.field("edit_id") == edit_id).to_pylist()
    return rows[0] if rows else None


def _redrive_id(tables: QueueTables, edit_id: str) -> str:
    """The id of the edit's redrive: the one its record names (an edit begun by an earlier version
    named it `<edit id>-redrive`), else derived from the edit id (domain/names.py)."""
    recorded = find_action(tables, edit_id)
    if recorded is not None and recorded.arguments.get("redrive_id"):
        return str(recorded.arguments["redrive_id"])
    return str(ActionName.parse(edit_id).edit_redrive())


def _result(edit_id: str, queue: str, source: str, message_id: str, body: bytes, row: dict[str, Any] | None,
            actor: str) -> EditResult:
    row = row or {}
    return EditResult(edit_id, message_id, queue, source,
                      row.get("redrive_id") or str(ActionName.parse(edit_id).edit_redrive()), row.get("actor") or actor,
                      row.get("encoding"), row.get("original_body"), body,
                      dict(row.get("original_headers") or []), dict(row.get("new_headers") or []))


def _run(declaration: Declaration, queue: str, source: str, message_id: str, body: bytes,
         given: dict[str, str], edit_id: str, actor: str, run_id: str, now: datetime | None,
         within: QueueWriter | None) -> EditResult:
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    redrive_id = _redrive_id(tables, edit_id)
    touched = [(tables, EDITS), (tables, source), (tables, INBOUND)]
    with operator_writer(declaration, tables, "edit", run_id, resuming=[edit_id, redrive_id],
                         within=within) as writer:
        record = Recorded.of(writer, "edit", edit_id)
        action = record.action
        if action is not None and record.finished:  # another run closed it meanwhile
            return _resume_or_done(declaration, queue, action, message_id, body, given, actor, run_id, now, writer)
        row = edit_row(tables, edit_id)
        if row is not None:
            message_id = row["message_id"]  # run again: the edit completes as it recorded it
        elif action is not None and (action.arguments.get("message_id") != message_id or
                                     action.arguments.get("body_sha256") != hashlib.sha256(body).hexdigest()):
            raise EditError(f"edit {edit_id} was begun for message {action.arguments.get('message_id')!r} with "
                            "another body, and killed before it recorded it: give another id. Nothing was changed.")
        if row is None:
            failed = tables.message_rows(source, message_id)
            if not failed:
                raise EditNotFound(f"message {message_id!r} left {queue}/{source} before edit {edit_id} "
                                   "recorded it; nothing was changed")
            original = failed[0]
            _validate(declaration, queue, message_id, body, original["encoding"])
            at = now or datetime.now(UTC)
            row = {"edit_id": edit_id, "message_id": message_id, "queue": queue, "source_table": source,
                   "source_batch_id": original["batch_id"], "redrive_id": redrive_id, "actor": actor, "at": at,
                   "encoding": original["encoding"], "original_body": original["body"], "new_body": body,
                   "original_headers": list(dict(original.get("headers") or []).items()),
                   "new_headers": list({**dict(original.get("headers") or []), **given}.items())}
            # Its plan is its row of the edits table (the message, the new body): begun, then that.
            action = record.begin(actor, {"message_id": message_id, "from": source, "to": queue,
                                          "redrive_id": redrive_id, "body_bytes": len(body),
                                          "body_sha256": hashlib.sha256(body).hexdigest(), "headers": given},
                                  touched, run_id, at)
            _record(writer, edit_id, row)
        # The edit's record is begun before its row is written: a row means a record.
        assert action is not None, f"edit {edit_id} has a row but no record"
        new_headers = dict(row["new_headers"] or [])
        sent = redrive_table(declaration, queue, source, Selection(ids=(message_id,)), redrive_id=redrive_id,
                             force=True, actor=action.actor, run_id=run_id, now=now,
                             replace={message_id: _replacement(row["new_body"], new_headers)}, within=writer)
        # Killed after its redrive was recorded done, the edit runs again: the redrive moves nothing
        # now, and what it moved then is in its own record.
        redriven = find_action(tables, redrive_id) if sent.already_done else None
        moved = int(redriven.counts.get("moved", 0)) if redriven is not None else sent.moved
        done = record.finish({"moved": moved}, touched)
    result = _result(edit_id, queue, source, message_id, row["new_body"], row, action.actor)
    result.moved, result.action_id = moved, done.action_id
    return result


def _record(writer: QueueWriter, edit_id: str, row: dict[str, Any]) -> None:
    app = AppTransaction.action(edit_id)
    if (edits := writer.tables.open_if_exists(EDITS)) is None or not committed(edits, app):
        writer.append(EDITS, pa.Table.from_pylist([row], schema=schemas.EDITS), app_id=app.name, version=1)


def edits_of(declaration: Declaration, message_id: str) -> list[dict[str, Any]]:
    """Every recorded edit of a message, in every queue, oldest first."""
    found = []
    for name in declaration.queues:
        found += QueueTables.of(declaration, name).message_rows(EDITS, message_id)
    return sorted(found, key=lambda r: (r["at"], r["edit_id"]))


def complete_interrupted_edit(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> None:
    """An edit a kill left planned after it recorded its new body, completed by its queue's next
    holder: the recorded message and body go back (one killed before has nothing to complete)."""
    row = edit_row(writer.tables, action.action_id)
    if row is None:
        raise EditError(f"edit {action.action_id} recorded no new body: nothing to complete")
    edit_message(declaration, action.arguments["message_id"], row["new_body"], queue=writer.tables.queue,
                 source=action.arguments["from"], edit_id=action.action_id, actor=action.actor, run_id=run_id,
                 within=writer)
