"""`enable`: resume a disabled queue, recorded in the actions ledger."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, field_validator

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations.actions import Action, Recorded, new_action_id
from poison_pipeline.operations.requests import ActionContext, Request, not_blank
from poison_pipeline.storage.control import QueueState, queue_state, set_enabled
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline.storage.writer import queue_writer


@dataclass(frozen=True)
class EnableResult:
    queue: str
    changed: bool  # False: it was enabled already and nothing but the action was recorded
    before: QueueState
    action: Action


class EnableOptions(Request):
    """What enabling takes besides its queue: the run config of a queue's enable job in Dagster."""

    reason: str = Field(default="re-enabled by an operator", description="Why the queue is resumed (recorded).")

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        return not_blank(value) or value


class EnableRequest(EnableOptions):
    """Resuming a disabled queue's cycles."""

    queue: str = Field(description="The application queue to enable.")


def enable(declaration: Declaration, request: EnableRequest, context: ActionContext | None = None) -> EnableResult:
    """Enable the queue under its lease; raises StateNotRecorded if the state does not show it after."""
    context = context or ActionContext()
    queue, actor, reason, run_id = request.queue, context.actor, request.reason, context.run_id
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    touched = [(tables, EVENTS)]
    with queue_writer(tables, "enable", run_id) as writer:
        before = queue_state(tables)
        record = Recorded(writer, "enable", new_action_id("enable"))
        record.begin(actor, {"reason": reason}, touched, run_id)
        changed = set_enabled(tables, True, actor, reason, run_id, within=writer)
        action = record.finish({"changed": changed}, touched)
    return EnableResult(queue, changed, before, action)
