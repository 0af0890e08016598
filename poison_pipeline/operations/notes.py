"""`groups note`: a note on a failure group ("under investigation", who owns it), recorded in the
actions ledger of each queue that holds the group and shown wherever the group is (`groups`, the
Dagster failure-group table). A group's note is its newest."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, field_validator

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations.actions import Recorded, new_action_id
from poison_pipeline.operations.groups import NOTE, UnknownGroup, failure_groups
from poison_pipeline.operations.requests import ActionContext, Request, not_blank
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import queue_writer

__all__ = ["NoteRequest", "NoteResult", "note_group"]


class NoteRequest(Request):
    """A note on a failure group."""

    group: str = Field(description="The failure group's id, as `groups` shows it.")
    text: str = Field(description="The note (who looks into it, what is known).")
    owner: str | None = Field(default=None, description="Who owns the group.")
    queue: str | None = Field(default=None, description="Only in this queue; default: every queue holding "
                              "the group.")

    @field_validator("group")
    @classmethod
    def _group_id(cls, value: str) -> str:
        # A group id as `groups` prints it may carry the version it read: a note is the group's.
        return value.strip().lower().partition("@")[0]

    @field_validator("text", "owner", "queue")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        return not_blank(value)


@dataclass(frozen=True)
class NoteResult:
    group: str
    # The queues whose actions ledger recorded the note, and the note's action id in each.
    action_ids: dict[str, str]


def note_group(declaration: Declaration, request: NoteRequest, context: ActionContext | None = None) -> NoteResult:
    """Record `request`'s note in each queue that holds the group (UnknownGroup when none does)."""
    context = context or ActionContext()
    if request.queue is not None:
        declaration.queue(request.queue)  # KeyError naming the declared queues
    holding = sorted({g.queue for g in failure_groups(declaration, request.queue) if g.id == request.group})
    if not holding:
        where = f"queue {request.queue!r}" if request.queue else f"queues {', '.join(declaration.queues)}"
        raise UnknownGroup(request.group, f"no failure table of {where} holds it: a note is for a group "
                                          "`groups` lists")
    recorded = {}
    arguments = {"group": request.group, "text": request.text, "owner": request.owner}
    for queue in holding:
        tables = QueueTables.of(declaration, queue)
        with queue_writer(tables, NOTE, context.run_id) as writer:
            record = Recorded(writer, NOTE, new_action_id(NOTE))
            record.begin(context.actor, arguments, [], context.run_id)
            recorded[queue] = record.finish({}, []).action_id
    return NoteResult(request.group, recorded)
