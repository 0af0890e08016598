"""The actions ledger: one row per operator action on a queue (who, when, with what arguments, its
state and counts, and the Delta versions of every table it touched before and after).

An action is recorded `planned` before it changes anything and `done` after, so a killed action
shows as planned and running it again with the same id completes it; `undo` marks it `undone`.
One killed before it wrote its plan moved nothing, and its default id was never printed: the queue's
next cycle closes it `abandoned` (operations/interrupted.py), so no action stays planned for good.
An action id names one action: a default id is new at every invocation (never derived from the
arguments, which repeat), and an id one queue's ledger holds is refused to an action of another.
Every action keeps its record through one object, `Recorded` (begin, plan, finish), and every kind
is declared (`KINDS`), resumable with its completion or not.

Every operator command that moves messages holds its queue's writer through `operator_writer`,
which first finishes the queue's cycles a kill left staged (engine/recovery.py) and completes its
other operator actions left planned (operations/interrupted.py): a message such a cycle took is
still in its waiting table, and one an interrupted redrive sent back is still in its failure table
too; moving it before those commits land would leave it in two places.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import DeltaTable

from poison_pipeline.domain.alerts import ACTION_LEFT
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.names import ActionName, AppTransaction
from poison_pipeline.engine.recovery import finish_interrupted_cycles
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import event_row
from poison_pipeline.storage.events import append_events
from poison_pipeline.storage.plans import Plan, read_plan, remove_plan, write_plan
from poison_pipeline.storage.tables import ACTIONS, QueueTables
from poison_pipeline.storage.writer import QueueWriter, queue_writer

PLANNED, DONE, UNDONE, ABANDONED = "planned", "done", "undone", "abandoned"


@dataclass(frozen=True)
class Action:
    action_id: str
    kind: str
    queue: str
    actor: str
    at: datetime
    arguments: dict[str, Any]
    state: str
    counts: dict[str, Any] = field(default_factory=dict)
    # "queue/table" -> {"before": version, "after": version}
    versions: dict[str, dict[str, int | None]] = field(default_factory=dict)
    run_id: str = "manual"
    finished_at: datetime | None = None

    def version_before(self, tables: QueueTables, table: str) -> int | None:
        """The version `table` had when the action began (-1: it did not exist yet), or None when the
        action did not record that table."""
        entry = self.versions.get(_table_key(tables, table))
        if entry is None:
            return None
        before = entry.get("before")
        return -1 if before is None else before


def default_actor() -> str:
    """Who is acting when nobody says: the operating system's login name."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in some containers
        return "unknown"


def new_action_id(kind: str) -> str:
    """A new id, unlike any other: a rerun of the same command with the same arguments is a new action."""
    return str(ActionName.default(kind))


def committed(table: DeltaTable, app: AppTransaction) -> bool:
    """Whether `table` records the commit of `app`, under its name or the one an earlier version gave
    it: an action that version began completes here without writing its commit twice."""
    return any(table.transaction_version(name) is not None for name in app.spellings())


def queue_recording(declaration: Declaration, action_id: str, other_than: str) -> str | None:
    """The queue, other than `other_than`, whose actions ledger records `action_id`, if any."""
    for name in declaration.queues:
        if name != other_than and find_action(QueueTables.of(declaration, name), action_id) is not None:
            return name
    return None


def reused_id(declaration: Declaration, action_id: str, queue: str, kind: str) -> str | None:
    """Why an operator's `--id` cannot name a `kind` of `queue`: another queue's action has it, or
    another kind of action of this queue. None: it is new, or names this queue's own `kind` (run
    again, that action completes as it was recorded)."""
    if (owner := queue_recording(declaration, action_id, queue)) is not None:
        return (f"--id {action_id!r} is already used by an action of queue {owner!r}: an id names one action of "
                "one queue; give another id. Nothing was changed.")
    recorded = find_action(QueueTables.of(declaration, queue), action_id)
    if recorded is not None and recorded.kind != kind:
        return (f"--id {action_id!r} is already used by queue {queue!r} for an action of kind {recorded.kind!r}, "
                f"not {kind!r}: an id names one action; give another id. Nothing was changed.")
    return None


@contextmanager
def operator_writer(declaration: Declaration, tables: QueueTables, purpose: str, run_id: str = "manual",
                    resuming: Sequence[str] = (), *, within: QueueWriter | None = None) -> Iterator[QueueWriter]:
    """The queue's writer for an operator command that moves messages, once the cycles a kill left
    staged are finished and the actions left planned completed, but those the command itself
    resumes (`resuming`): their commits land before the command reads where a message is."""
    with queue_writer(tables, purpose, run_id, within=within) as writer:
        if not writer.settled:
            # Imported here: completing an action runs the commands that hold this writer.
            from poison_pipeline.operations.interrupted import complete_interrupted

            writer.settled = True
            finish_interrupted_cycles(declaration, writer)
            complete_interrupted(declaration, writer, run_id, resuming)
        yield writer


def _table_key(tables: QueueTables, table: str) -> str:
    return f"{tables.queue}/{table}"


def table_version(tables: QueueTables, table: str) -> int | None:
    return tables.open(table).version() if tables.exists(table) else None


def _from_row(row: dict[str, Any]) -> Action:
    return Action(row["action_id"], row["kind"], row["queue"], row["actor"], row["at"],
                  json.loads(row["arguments"]), row["state"], json.loads(row["counts"] or "{}"),
                  json.loads(row["versions"] or "{}"), row["run_id"], row["finished_at"])


def find_action(tables: QueueTables, action_id: str) -> Action | None:
    if not tables.exists(ACTIONS):
        return None
    rows = tables.open(ACTIONS).to_pyarrow_dataset().to_table(
        filter=pads.field("action_id") == action_id).to_pylist()
    return _from_row(rows[0]) if rows else None


def planned_actions(tables: QueueTables, kinds: Sequence[str], *, snapshot: DeltaTable | None = None
                    ) -> list[Action]:
    """The actions of these kinds still `planned` (begun, then killed), oldest first. `snapshot`:
    the actions ledger as the caller holds it, else it is loaded."""
    ledger = snapshot if snapshot is not None else tables.open_if_exists(ACTIONS)
    if ledger is None:
        return []
    rows = ledger.to_pyarrow_dataset().to_table(
        filter=(pads.field("state") == PLANNED) & pads.field("kind").isin(list(kinds))).to_pylist()
    return sorted((_from_row(row) for row in rows), key=lambda action: action.at)


# Every kind of action the ledger records. A kill can leave the `RESUMABLE` ones half done: the
# queue's next holder completes them (operations/interrupted.py holds one completion per kind, each
# in its action's module; a test keeps the two lists equal). The others commit once, or are safe to
# run again by hand (`end-conversation`), and leave nothing to complete.
RESUMABLE = ("redrive", "edit", "purge", "archive", "restore", "ramp", "undo")
KINDS = (*RESUMABLE, "enable", "end_conversation", "note")


def begin_action(writer: QueueWriter, kind: str, actor: str, arguments: dict[str, Any],
                 touched: list[tuple[QueueTables, str]], action_id: str | None = None,
                 run_id: str = "manual", now: datetime | None = None) -> Action:
    """Record an action as planned (with the versions of the tables it will touch), or return the
    recorded one when `action_id` names an action already begun. A kind not in KINDS is refused: a
    new action is declared resumable (with its completion) or not, before it can be recorded."""
    if kind not in KINDS:
        raise ValueError(f"action kind {kind!r} is not declared: add it to KINDS (and, if a kill can leave it "
                         "half done, to RESUMABLE with its completion in operations/interrupted.py)")
    tables = writer.tables
    tables.ensure()
    if action_id is not None and (existing := find_action(tables, action_id)) is not None:
        return existing
    action = Action(action_id or new_action_id(kind), kind, tables.queue, actor, now or datetime.now(UTC),
                    arguments, PLANNED, {}, {_table_key(t, name): {"before": table_version(t, name), "after": None}
                                             for t, name in touched}, run_id)
    writer.append(ACTIONS, pa.Table.from_pylist([_row(action)], schema=schemas.ACTIONS))
    return action


@dataclass
class Recorded:
    """One action's record, kept to one protocol: begun `planned` before it changes anything, its
    plan committed once (what it will change, and the versions it read that from), finished `done`
    with its counts and its plan removed. A kill anywhere leaves it `planned`, with or without its
    plan: run again with its id, or completed by the queue's next holder (operations/interrupted.py),
    it goes on from its plan, never planning twice. Every operator action that moves messages keeps
    its record through this object, under its queue's writer."""

    writer: QueueWriter
    kind: str
    action_id: str
    action: Action | None = None  # as recorded; None until begun

    @classmethod
    def of(cls, writer: QueueWriter, kind: str, action_id: str) -> Recorded:
        """The record of `action_id` as the queue's ledger has it (not begun: `action` None)."""
        return cls(writer, kind, action_id, find_action(writer.tables, action_id))

    @property
    def finished(self) -> bool:
        """Recorded done, undone or abandoned: nothing is left to complete."""
        return self.action is not None and self.action.state != PLANNED

    def begin(self, actor: str, arguments: dict[str, Any], touched: list[tuple[QueueTables, str]],
              run_id: str, now: datetime | None = None) -> Action:
        """Record the action planned (once: begun already, the recorded one is kept)."""
        if self.action is None:
            self.action = begin_action(self.writer, self.kind, actor, arguments, touched, action_id=self.action_id,
                                       run_id=run_id, now=now)
        return self.action

    def plan(self) -> Plan | None:
        """The plan recorded; None before it was (or after the action finished)."""
        return read_plan(self.writer.tables, self.kind, self.action_id)

    def record_plan(self, rows: pa.Table, versions: dict[str, int | None]) -> None:
        """Commit the plan, once, after `begin` and before the first change it plans."""
        if self.action is None:
            raise RuntimeError(f"{self.kind} {self.action_id}: a plan is recorded after the action is begun")
        write_plan(self.writer, self.kind, self.action_id, rows, versions)

    def finish(self, counts: dict[str, Any], touched: list[tuple[QueueTables, str]]) -> Action:
        """Record the action done with its counts, then remove its plan (a kill between the two leaves
        a plan that the next holder removes: `clear`)."""
        if self.action is None:
            raise RuntimeError(f"{self.kind} {self.action_id}: finished before it was begun")
        self.action = finish_action(self.writer, self.action, counts, touched)
        self.clear()
        return self.action

    def clear(self) -> None:
        """Remove the plan of a finished action (killed after it was recorded done)."""
        remove_plan(self.writer, self.kind, self.action_id)


def _row(action: Action) -> dict[str, Any]:
    return {"action_id": action.action_id, "kind": action.kind, "queue": action.queue, "actor": action.actor,
            "at": action.at, "arguments": json.dumps(action.arguments, sort_keys=True, default=str),
            "state": action.state, "counts": json.dumps(action.counts, sort_keys=True, default=str),
            "versions": json.dumps(action.versions, sort_keys=True), "run_id": action.run_id,
            "finished_at": action.finished_at}


def _update(writer: QueueWriter, action: Action) -> None:
    # Written back as plain strings: delta-rs's update writes string_view columns (see replace_batches).
    quoted = action.action_id.replace("'", "''")
    writer.overwrite_where(ACTIONS, pa.Table.from_pylist([_row(action)], schema=schemas.ACTIONS),
                           f"action_id = '{quoted}'", f"recording action {action.action_id} as {action.state}")


def finish_action(writer: QueueWriter, action: Action, counts: dict[str, Any],
                  touched: list[tuple[QueueTables, str]], now: datetime | None = None) -> Action:
    """Record the action done with its counts and the versions it left the tables at."""
    versions = {key: dict(value) for key, value in action.versions.items()}
    for t, name in touched:
        versions.setdefault(_table_key(t, name), {"before": None})["after"] = table_version(t, name)
    done = Action(action.action_id, action.kind, action.queue, action.actor, action.at, action.arguments, DONE,
                  counts, versions, action.run_id, now or datetime.now(UTC))
    _update(writer, done)
    return done


def abandon_action(writer: QueueWriter, action: Action, why: str, now: datetime | None = None) -> Action:
    """Close a planned action that changed nothing: its tables keep no "after" version, so nothing
    can be undone, and its id stays taken."""
    closed = Action(**{**action.__dict__, "state": ABANDONED, "counts": {"moved": 0, "abandoned": why},
                       "finished_at": now or datetime.now(UTC)})
    _update(writer, closed)
    return closed


def note_left(writer: QueueWriter, action: Action, why: str, now: datetime | None = None) -> Action:
    """Record on a planned action why its completion was left (`left` in its counts, which
    `poison-pipeline actions` shows) and raise an `action_left` event for the alert hook; once per
    reason, not at every cycle that finds it."""
    if action.counts.get("left") == why:
        return action
    noted = Action(**{**action.__dict__, "counts": {**action.counts, "left": why}})
    _update(writer, noted)
    reason = (f"{action.kind} {action.action_id} was interrupted and its completion cannot go on, so it is left "
              f"planned for an operator while the queue goes on: {why}")
    append_events(writer, pa.Table.from_pylist(
        [event_row(ACTION_LEFT, now or datetime.now(UTC), "poison_pipeline", reason, table=ACTIONS)],
        schema=schemas.EVENTS))
    return noted


def mark_undone(writer: QueueWriter, action: Action) -> Action:
    undone = Action(**{**action.__dict__, "state": UNDONE})
    _update(writer, undone)
    return undone


def list_actions(declaration: Declaration, queue: str | None = None) -> list[Action]:
    """Every recorded action, oldest first, of one queue or of all."""
    found: list[Action] = []
    for name in [queue] if queue else list(declaration.queues):
        tables = QueueTables.of(declaration, name)
        if tables.exists(ACTIONS):
            found += [_from_row(r) for r in tables.open(ACTIONS).to_pyarrow_table().to_pylist()]
    return sorted(found, key=lambda a: (a.at, a.action_id))
