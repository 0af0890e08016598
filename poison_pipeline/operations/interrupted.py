"""Operator actions a kill left half done, completed by the next holder of the queue's lease.

A redrive (or an edit's redrive), a purge or an undo killed between its commits can leave a message
in two places: back in the inbound and still in poison, or in the purged ledger and still in
dead_letter. A cycle that took such a message first would handle a copy the action meant to remove,
so every cycle, and every operator command that moves messages (operations/actions.py,
`operator_writer`), first completes what its queue's ledger shows `planned` (SPEC section 8: an
action run again with its id completes; here the queue runs it again without waiting for the
operator).
A redrive or an edit killed before it wrote its plan (an edit: its new body) moved nothing, and a
default id was never printed, so nobody could run it again by its id: it is closed `abandoned`
(nothing moved, nothing to undo); the operator runs the command again as a new action. A purge has
all it needs in its record (its selection and cut-off) and is completed as recorded.
A completion moves only the messages still where the action's plan found them (each command's own
resume path checks it) and counts the others as moved since. One that cannot go on, whatever stops
it (a redrive whose committed chunk is nowhere in its target, a version a vacuum deleted, a missing
file, any other error), is left `planned` for the operator with its reason recorded in its counts
(`left`, shown by `poison-pipeline actions`) and in the report's `interrupted`, and the cycle or
command goes on: a queue is never wedged by one action; an `action_left` event alerts the operator.
An undo whose other queue stayed busy is left for the next holder without an alert. Only a lost
lease stops it (its holder may write nothing more).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.engine.cycle import Completed
from poison_pipeline.engine.recovery import finish_interrupted_cycles
from poison_pipeline.operations import purge as purging
from poison_pipeline.operations.actions import (
    PLANNED,
    RESUMABLE,
    Action,
    abandon_action,
    find_action,
    note_left,
    planned_actions,
)
from poison_pipeline.operations.archive import ArchiveError, complete_interrupted_archive
from poison_pipeline.operations.edit import EditError, EditNotFound, complete_interrupted_edit, edit_row
from poison_pipeline.operations.purge import PurgeError
from poison_pipeline.operations.ramp import complete_interrupted_ramp
from poison_pipeline.operations.redrive import RedriveError, complete_interrupted_redrive, planned_rows
from poison_pipeline.operations.undo import UndoError, complete_interrupted_undo
from poison_pipeline.storage.lease import LeaseHeld, LeaseLost
from poison_pipeline.storage.plans import remove_finished_plans
from poison_pipeline.storage.tables import ACTIONS, QueueTables
from poison_pipeline.storage.writer import QueueWriter

# What a completion raises when it refuses to go on, in words meant for the operator.
_REFUSALS = (RedriveError, PurgeError, ArchiveError, UndoError, EditError, EditNotFound)
# The actions a kill can leave half done, in the order they are completed: redrives before edits
# (an edit completes through its own redrive) and undos last.
INTERRUPTIBLE = RESUMABLE


def interrupted_actions(tables: QueueTables) -> tuple[int, int | None]:
    """How many actions of the queue a kill left half done (its next cycle completes them), and the
    version of its actions ledger that says so (None without one)."""
    ledger = tables.open_if_exists(ACTIONS)
    if ledger is None:
        return 0, None
    return len(planned_actions(tables, INTERRUPTIBLE, snapshot=ledger)), ledger.version()


def complete_interrupted(declaration: Declaration, writer: QueueWriter, run_id: str,
                         resuming: Sequence[str] = ()) -> Completed:
    """Complete every interrupted redrive, edit, purge and undo of `tables.queue` but those `resuming`
    (a command run again with its id completes its own); call holding its lease."""
    tables = writer.tables
    writer.settled = True  # the commands a completion runs hold this writer: they complete nothing more
    outcome = Completed()
    planned = sorted((a for a in planned_actions(tables, INTERRUPTIBLE, snapshot=writer.latest_if_exists(ACTIONS))
                      if a.action_id not in resuming),
                     key=lambda a: INTERRUPTIBLE.index(a.kind))
    if planned:  # a completion must not move what a cycle a kill left staged took
        finish_interrupted_cycles(declaration, writer)
    # An edit's own redrive, killed before its plan, is planned again by the edit's completion.
    by_edits = {a.arguments.get("redrive_id") for a in planned if a.kind == "edit"}
    busy: set[str] = set()
    for action in planned:
        if _abandoned(tables, action, by_edits):
            abandon_action(writer, action, "killed before it planned anything: nothing moved")
            outcome.abandoned.append(action.action_id)
            continue
        try:
            why = _complete(declaration, writer, action, run_id)
        except LeaseLost:
            raise  # this holder may write nothing more: the next one completes the action
        except LeaseHeld as error:
            # The other queue of an undo stayed busy: its next holder completes it, nobody need look.
            busy.add(action.action_id)
            why = str(error)
        except _REFUSALS as error:
            why = str(error)
        except Exception as error:  # noqa: BLE001 - whatever stops a completion must not stop the queue
            # A vacuumed version, a file deleted by hand, a bug: the action waits for the operator,
            # and the cycle or command that found it goes on with the rest of the queue.
            why = f"{type(error).__name__}: {error}"
        if why is None:
            outcome.completed.append(action.action_id)
        else:
            outcome.left[action.action_id] = why
    # An edit completes its own redrive, left above when it had no plan yet.
    for action_id in list(outcome.left):
        if (now := find_action(tables, action_id)) is not None and now.state != PLANNED:
            del outcome.left[action_id]
            outcome.completed.append(action_id)
    # What is left now waits for the operator: its reason recorded and alerted, once. Read again:
    # the completion that failed may have recorded more of it first.
    for action_id, why in outcome.left.items():
        if action_id not in busy and (now := find_action(tables, action_id)) is not None and now.state == PLANNED:
            note_left(writer, now, why)
    # An action killed between its `done` record and its plan's removal left nothing but the plan.
    remove_finished_plans(writer, lambda action_id: (now := find_action(tables, action_id)) is not None
                          and now.state != PLANNED)
    writer.completed_actions += [*outcome.completed, *outcome.abandoned]
    return outcome


def _abandoned(tables: QueueTables, action: Action, by_edits: set[str | None]) -> bool:
    """A redrive (not an edit's) with no plan, or an edit with no recorded new body: it moved nothing."""
    if action.kind == "redrive":
        return action.action_id not in by_edits and planned_rows(tables, action.action_id) is None
    return action.kind == "edit" and edit_row(tables, action.action_id) is None


def _complete_purge(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> None:
    purging.finish_interrupted(declaration, writer, action)


# How each resumable kind of action is completed, in its own module (actions.RESUMABLE lists them).
COMPLETIONS: dict[str, Callable[[Declaration, QueueWriter, Action, str], None]] = {
    "redrive": complete_interrupted_redrive,
    "edit": complete_interrupted_edit,
    "purge": _complete_purge,
    "archive": complete_interrupted_archive,
    "restore": complete_interrupted_archive,
    "ramp": complete_interrupted_ramp,
    "undo": complete_interrupted_undo,
}


def _complete(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> str | None:
    """None once `action` is complete, else why it was left as it is."""
    COMPLETIONS[action.kind](declaration, writer, action, run_id)
    return None
