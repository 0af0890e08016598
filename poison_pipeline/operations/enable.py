"""`enable`: resume a disabled queue, recorded in the actions ledger."""

from __future__ import annotations

from dataclasses import dataclass

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations.actions import Action, begin_action, finish_action
from poison_pipeline.storage.control import QueueState, queue_state, set_enabled
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline.storage.writer import queue_writer


@dataclass(frozen=True)
class EnableResult:
    queue: str
    changed: bool  # False: it was enabled already and nothing but the action was recorded
    before: QueueState
    action: Action


def enable(declaration: Declaration, queue: str, actor: str, reason: str, run_id: str = "manual") -> EnableResult:
    """Enable `queue` under its lease; raises StateNotRecorded if the state does not show it after."""
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    touched = [(tables, EVENTS)]
    with queue_writer(tables, "enable", run_id) as writer:
        before = queue_state(tables)
        action = begin_action(writer, "enable", actor, {"reason": reason}, touched, run_id=run_id)
        changed = set_enabled(tables, True, actor, reason, run_id)
        action = finish_action(writer, action, {"changed": changed}, touched)
    return EnableResult(queue, changed, before, action)
