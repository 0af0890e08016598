"""`undo`: reverse an operator action, itself recorded as an action.

Two ways, as the ledger allows:

- **restore**: when no other commit touched the action's tables since it finished (each is still
  at the version it left it at), every table is restored to the version it had before (Delta
  RESTORE, itself a commit);
- **compensate**: otherwise, the messages still where the action put them are moved back, taken
  from the source table as it was before the action (Delta time travel), and those that moved on
  since (processed, failed again...) are named as no longer recoverable.

Both are safe to run again: a message is appended back only if it is not there already, under an
app transaction, and removed from where the action put it only if it is still there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.operations.actions import (
    DONE,
    UNDONE,
    Action,
    begin_action,
    default_actor,
    find_action,
    finish_action,
    mark_undone,
    table_version,
)
from poison_pipeline.storage.tables import QueueTables, schema_of


class UndoError(ValueError):
    """An action that cannot be undone; the message says why."""


@dataclass
class UndoResult:
    undo_id: str
    action_id: str
    kind: str
    how: str  # "restore" or "compensate"
    restored: int = 0  # messages back where they were before the action
    unrecoverable: list[str] = field(default_factory=list)  # moved on since: processed, failed again...
    already_undone: bool = False


def undo(declaration: Declaration, action_id: str, actor: str | None = None, run_id: str = "manual",
         now: datetime | None = None) -> UndoResult:
    """Undo the action `action_id` (found in any queue's ledger)."""
    action = find_recorded(declaration, action_id)
    if action is None:
        raise UndoError(f"no action {action_id!r} is recorded (see `poison-pipeline actions`)")
    if action.kind not in _UNDOERS:
        raise UndoError(f"action {action_id!r} is a {action.kind}, which cannot be undone "
                        f"(undo reverses {', '.join(sorted(_UNDOERS))})")
    if action.state == UNDONE:
        return UndoResult(f"undo-{action_id}", action_id, action.kind, "", already_undone=True)
    if action.state != DONE:
        raise UndoError(f"action {action_id!r} is {action.state}: run it again with its id to complete it "
                        "before undoing it")
    tables = QueueTables.of(declaration, action.queue)
    with tables.lease("undo", run_id):
        return _UNDOERS[action.kind](declaration, tables, action, actor or default_actor(), run_id,
                                     now or datetime.now(UTC))


def _untouched_since(declaration: Declaration, action: Action) -> bool:
    for key, versions in action.versions.items():
        queue, table = key.split("/", 1)
        if table_version(QueueTables.of(declaration, queue), table) != versions["after"]:
            return False
    return True


def _undo_redrive(declaration: Declaration, tables: QueueTables, action: Action, actor: str, run_id: str,
                  now: datetime) -> UndoResult:
    source, target = action.arguments["from"], QueueTables.of(declaration, action.arguments["to"])
    undo_id = f"undo-{action.action_id}"
    touched = [(tables, source), (target, INBOUND)]
    restore = _untouched_since(declaration, action)
    record = begin_action(tables, "undo", actor, {"action_id": action.action_id, "how": "restore" if restore
                                                  else "compensate"}, touched, action_id=undo_id, run_id=run_id,
                          now=now)
    how = record.arguments["how"]  # as first decided, when an interrupted undo runs again
    with target.lease("undo", run_id):
        if how == "restore":
            result = _restore(declaration, action, undo_id)
        else:
            result = _compensate(tables, source, target, action, undo_id)
    finish_action(tables, record, {"restored": result.restored, "unrecoverable": len(result.unrecoverable)},
                  touched)
    mark_undone(tables, action)
    return result


def _restore(declaration: Declaration, action: Action, undo_id: str) -> UndoResult:
    restored = 0
    for key, versions in action.versions.items():
        queue, table = key.split("/", 1)
        tables = QueueTables.of(declaration, queue)
        current = tables.open(table)
        # Run again after a crash: a table restored already is at a later version with the old content.
        if versions["before"] is not None and current.version() == versions["after"]:
            current.restore(versions["before"])
    restored = int(action.counts.get("moved", 0))
    return UndoResult(undo_id, action.action_id, action.kind, "restore", restored=restored)


def _compensate(tables: QueueTables, source: str, target: QueueTables, action: Action,
                undo_id: str) -> UndoResult:
    prefix = f"{action.action_id}-"
    inbound = target.open(INBOUND).to_pyarrow_dataset().to_table(
        columns=["message_id", "batch_id"], filter=pc.starts_with(pc.field("batch_id"), prefix))
    still = set(inbound["message_id"].to_pylist())
    versions = action.versions[f"{tables.queue}/{source}"]
    original = _as_of(tables, source, versions["before"])
    moved_then = original.filter(pc.invert(pc.is_in(
        original["message_id"], value_set=_as_of(tables, source, versions["after"])["message_id"])))
    unrecoverable = sorted(set(moved_then["message_id"].to_pylist()) - still)
    back = moved_then.filter(pc.is_in(moved_then["message_id"], value_set=pa.array(sorted(still), pa.string())))
    present = tables.open(source).to_pyarrow_dataset().to_table(
        columns=["message_id"], filter=pads.field("message_id").isin(sorted(still)))
    back = back.filter(pc.invert(pc.is_in(back["message_id"], value_set=present["message_id"])))
    if back.num_rows:
        tables.append(source, back.cast(schema_of(source)), app_id=f"poison_pipeline/{undo_id}", version=1)
    if inbound.num_rows:
        batches = sorted(set(inbound["batch_id"].to_pylist()))
        target.replace_batches(INBOUND, batches, keep=~pads.field("message_id").isin(sorted(still)))
    return UndoResult(undo_id, action.action_id, action.kind, "compensate", restored=len(still),
                      unrecoverable=unrecoverable)


def _as_of(tables: QueueTables, table: str, version: int | None) -> pa.Table:
    """The table as it was at `version` (Delta time travel); the redrive held the queue's lease, so
    what left the source between its versions before and after is exactly what it moved."""
    if version is None:
        return schema_of(table).empty_table()
    return DeltaTable(tables.uri(table), version=version, storage_options=tables.storage_options).to_pyarrow_table()


_UNDOERS = {"redrive": _undo_redrive}


def find_recorded(declaration: Declaration, action_id: str) -> Action | None:
    """The action `action_id` in whichever queue's ledger has it."""
    for queue in declaration.queues:
        found = find_action(QueueTables.of(declaration, queue), action_id)
        if found is not None:
            return found
    return None
