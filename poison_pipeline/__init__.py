"""Poison-message handling for queued business messages, on Dagster, Spark and Delta Lake.

The public Python API is what `__all__` names; everything else is internal by its place. Each name is
imported on first use, so that importing one part (a Spark worker importing a handler's module, the
command line) does not import Dagster or Spark with it.

    from poison_pipeline import load_declaration, enqueue, run_cycle
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from poison_pipeline.defs.component import PoisonQueuesComponent
    from poison_pipeline.domain.declaration import Declaration, DeclarationError, load_declaration, parse_declaration
    from poison_pipeline.domain.envelope import Message
    from poison_pipeline.engine.cycle import CycleReport
    from poison_pipeline.engine.session import build_session
    from poison_pipeline.handlers import batch_handler
    from poison_pipeline.operations.actions import Action, list_actions
    from poison_pipeline.operations.cycle import run_cycle
    from poison_pipeline.operations.edit import EditError, EditNotFound, EditRequest, EditResult, edit
    from poison_pipeline.operations.enable import EnableRequest, EnableResult, enable
    from poison_pipeline.operations.end_conversation import EndConversationRequest, end_conversation
    from poison_pipeline.operations.groups import FailureGroup, UnknownGroup, failure_groups
    from poison_pipeline.operations.history import Journey, JourneyEvent, history
    from poison_pipeline.operations.inspect_message import InspectError, Inspection, inspect_message
    from poison_pipeline.operations.purge import PurgeError, PurgeRequest, PurgeResult, purge
    from poison_pipeline.operations.records import EnqueueResult, Refusal, enqueue
    from poison_pipeline.operations.redrive import (
        RedriveError,
        RedriveReport,
        RedriveRequest,
        RedriveResult,
        redrive,
    )
    from poison_pipeline.operations.requests import ActionContext
    from poison_pipeline.operations.status import QueueStatus, TableStatus, queue_status
    from poison_pipeline.operations.undo import UndoError, UndoRequest, UndoResult, undo

# name -> the module that defines it.
_WHERE = {
    # declaring queues and writing handlers
    "Declaration": "poison_pipeline.domain.declaration",
    "DeclarationError": "poison_pipeline.domain.declaration",
    "load_declaration": "poison_pipeline.domain.declaration",
    "parse_declaration": "poison_pipeline.domain.declaration",
    "Message": "poison_pipeline.domain.envelope",
    "batch_handler": "poison_pipeline.handlers",
    # sending and processing
    "enqueue": "poison_pipeline.operations.records",
    "EnqueueResult": "poison_pipeline.operations.records",
    "Refusal": "poison_pipeline.operations.records",
    "run_cycle": "poison_pipeline.operations.cycle",
    "CycleReport": "poison_pipeline.engine.cycle",
    "build_session": "poison_pipeline.engine.session",
    # the operator console
    "ActionContext": "poison_pipeline.operations.requests",
    "queue_status": "poison_pipeline.operations.status",
    "QueueStatus": "poison_pipeline.operations.status",
    "TableStatus": "poison_pipeline.operations.status",
    "failure_groups": "poison_pipeline.operations.groups",
    "FailureGroup": "poison_pipeline.operations.groups",
    "UnknownGroup": "poison_pipeline.operations.groups",
    "inspect_message": "poison_pipeline.operations.inspect_message",
    "Inspection": "poison_pipeline.operations.inspect_message",
    "InspectError": "poison_pipeline.operations.inspect_message",
    "history": "poison_pipeline.operations.history",
    "Journey": "poison_pipeline.operations.history",
    "JourneyEvent": "poison_pipeline.operations.history",
    "redrive": "poison_pipeline.operations.redrive",
    "RedriveRequest": "poison_pipeline.operations.redrive",
    "RedriveReport": "poison_pipeline.operations.redrive",
    "RedriveResult": "poison_pipeline.operations.redrive",
    "RedriveError": "poison_pipeline.operations.redrive",
    "edit": "poison_pipeline.operations.edit",
    "EditRequest": "poison_pipeline.operations.edit",
    "EditResult": "poison_pipeline.operations.edit",
    "EditError": "poison_pipeline.operations.edit",
    "EditNotFound": "poison_pipeline.operations.edit",
    "purge": "poison_pipeline.operations.purge",
    "PurgeRequest": "poison_pipeline.operations.purge",
    "PurgeResult": "poison_pipeline.operations.purge",
    "PurgeError": "poison_pipeline.operations.purge",
    "undo": "poison_pipeline.operations.undo",
    "UndoRequest": "poison_pipeline.operations.undo",
    "UndoResult": "poison_pipeline.operations.undo",
    "UndoError": "poison_pipeline.operations.undo",
    "enable": "poison_pipeline.operations.enable",
    "EnableRequest": "poison_pipeline.operations.enable",
    "end_conversation": "poison_pipeline.operations.end_conversation",
    "EndConversationRequest": "poison_pipeline.operations.end_conversation",
    "EnableResult": "poison_pipeline.operations.enable",
    "list_actions": "poison_pipeline.operations.actions",
    "Action": "poison_pipeline.operations.actions",
    # Dagster
    "PoisonQueuesComponent": "poison_pipeline.defs.component",
}

__all__ = [
    "Action",
    "ActionContext",
    "CycleReport",
    "Declaration",
    "DeclarationError",
    "EditError",
    "EditNotFound",
    "EditRequest",
    "EditResult",
    "EnableRequest",
    "EnableResult",
    "EndConversationRequest",
    "EnqueueResult",
    "FailureGroup",
    "InspectError",
    "Inspection",
    "Journey",
    "JourneyEvent",
    "Message",
    "PoisonQueuesComponent",
    "PurgeError",
    "PurgeRequest",
    "PurgeResult",
    "QueueStatus",
    "RedriveError",
    "RedriveReport",
    "RedriveRequest",
    "RedriveResult",
    "Refusal",
    "TableStatus",
    "UndoError",
    "UndoRequest",
    "UndoResult",
    "UnknownGroup",
    "batch_handler",
    "build_session",
    "edit",
    "enable",
    "end_conversation",
    "enqueue",
    "failure_groups",
    "history",
    "inspect_message",
    "list_actions",
    "load_declaration",
    "parse_declaration",
    "purge",
    "queue_status",
    "redrive",
    "run_cycle",
    "undo",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'poison_pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return list(__all__)
