"""`history`: one timeline of everything that happened to a message, in every queue, changing nothing.

Read with delta-rs and pyarrow only (filters on `message_id`), from:
- the envelope (`enqueued_at`) of any row that still holds it: `enqueued`;
- the attempts table: every `attempt` with its table, cycle, outcome, error and run id, and the
  delay computed before the next retry cycle when its cycle moved the message to one;
- the current rows: `waiting` in inbound or a retry subqueue, `poisoned`, `dead_lettered`,
  `quarantined`, and the processed ledger (`processed`, `dropped`, `duplicate`);
- `moved`: between the tables of consecutive attempts (the move is timed at the end of the earlier
  attempt, when its cycle routed it), and into the table a later redrive took it from;
- the actions ledger: `redriven` for each redrive that named the message (by id, or an edit's), or
  whose batch id (`<redrive id>-<chunk>`) is on a row of the message still in a table or in the
  processed ledger. A redrive by other filters of a message that has since failed again and left
  no row of that batch is not found: the ledger keeps a redrive's filters, not the ids it took;
- the edits table: `edited` (who, when, the sizes; the bodies are in `inspect`);
- the `archived` markers: `archived` (while it is; `restore` removes the marker);
- the `purged` table, when there is one: `purged`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pyarrow.dataset as pads
from deltalake import DeltaTable

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.durations import spoken, when
from poison_pipeline.domain.names import BatchName
from poison_pipeline.domain.routing import DEAD_LETTER, POISON, PROCESSED, QUARANTINE
from poison_pipeline.operations.actions import DONE, UNDONE, Action, list_actions
from poison_pipeline.storage.tables import ARCHIVED, ATTEMPTS, EDITS, QueueTables

PURGED = "purged"
# Which of two events at the same instant came first.
_ORDER = {"enqueued": 0, "waiting": 1, "attempt": 2, "moved": 3, "poisoned": 4, "dead_lettered": 4,
          "quarantined": 4, "edited": 5, "archived": 5, "redriven": 6, "processed": 7, "dropped": 7, "duplicate": 7,
          "purged": 8}


@dataclass(frozen=True)
class JourneyEvent:
    at: datetime | None
    kind: str
    queue: str
    table: str | None = None  # where it happened (for a move: where it went)
    detail: str = ""
    cycle: int | None = None
    cycle_seq: int | None = None  # the queue's cycle that did it (attempts, processed ledger)
    attempt: int | None = None
    outcome: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    run_id: str | None = None
    action_id: str | None = None
    batch_id: str | None = None
    actor: str | None = None
    from_table: str | None = None
    # An attempt after which its cycle moved the message to a retry subqueue: the delay computed
    # before that retry cycle (the policy's back-off, or a rule's), in seconds.
    retry_delay_s: float | None = None
    inferred: bool = False  # timed from the evidence around it, not recorded as such


@dataclass(frozen=True)
class Journey:
    message_id: str
    events: tuple[JourneyEvent, ...] = field(default_factory=tuple)


def history(declaration: Declaration, message_id: str) -> Journey:
    """Everything recorded about `message_id`, oldest first; no events when nothing is."""
    events: list[JourneyEvent] = []
    enqueued: list[tuple[datetime, str]] = []
    batches: set[str] = set()
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        for table in (*tables.waiting, DEAD_LETTER, QUARANTINE):
            for row in tables.message_rows(table, message_id):
                if row.get("enqueued_at") is not None:
                    enqueued.append((row["enqueued_at"], queue))
                if row.get("batch_id"):
                    batches.add(row["batch_id"])
                events.append(_stay(queue, table, row))
        for row in tables.message_rows(PROCESSED, message_id):
            if row.get("batch_id"):
                batches.add(row["batch_id"])
            events.append(JourneyEvent(row["at"], row["disposition"], queue, PROCESSED,
                                       f"{row['disposition']} from {row['from_table']}", batch_id=row["batch_id"],
                                       from_table=row["from_table"], cycle_seq=row.get("cycle_seq")))
        attempts = sorted(tables.message_rows(ATTEMPTS, message_id),
                          key=lambda r: (r["started_at"] is None, r["started_at"], r.get("cycle_seq") or 0,
                                         r["attempt"]))
        events += [_attempt(queue, row) for row in attempts]
        for row in tables.message_rows(EDITS, message_id):
            events.append(JourneyEvent(
                row["at"], "edited", queue, row["source_table"],
                f"body replaced ({row['encoding']}, {len(row['original_body'] or b'')} -> "
                f"{len(row['new_body'] or b'')} bytes); sent back by {row['redrive_id']}",
                action_id=row["edit_id"], actor=row["actor"]))
        for row in tables.message_rows(ARCHIVED, message_id):
            events.append(JourneyEvent(row["archived_at"], "archived", queue, row["from_table"],
                                       f"archived in {row['from_table']} (left out of groups, checks and alerts)",
                                       action_id=row["action_id"], batch_id=row["batch_id"]))
        for row in tables.message_rows(PURGED, message_id):
            at = row.get("purged_at") or row.get("at")
            events.append(JourneyEvent(at, "purged", queue, row.get("table") or row.get("from_table"),
                                       "purged", action_id=row.get("action_id"), actor=row.get("actor")))
    events += _redrives(declaration, message_id, batches)
    first = _first_enqueue(declaration, message_id, events, enqueued)
    cycles: dict[tuple[str, int], datetime] = {}
    for e in events:
        if e.kind == "attempt" and e.cycle_seq is not None and e.at is not None:
            cycles[(e.queue, e.cycle_seq)] = max(e.at, cycles.get((e.queue, e.cycle_seq), e.at))
    if first is not None:
        events.append(first)
    keyed = _with_moves(_keyed(events, cycles))
    return Journey(message_id, tuple(e for _, e in keyed))


def _first_enqueue(declaration: Declaration, message_id: str, events: list[JourneyEvent],
                   enqueued: list[tuple[datetime, str]]) -> JourneyEvent | None:
    """When it was enqueued: from a row that still holds its envelope, else from the table of its
    first attempt as it was when that attempt started (Delta time travel: the row was there then)."""
    timed = sorted(((e.at, e) for e in events if e.kind == "attempt" and e.at is not None), key=lambda pair: pair[0])
    batch = None
    if timed:
        first_at, first = timed[0]
        tables = QueueTables.of(declaration, first.queue)
        try:
            then = tables.open(first.table or "")
            then.load_as_version(first_at)
            rows = then.to_pyarrow_dataset().to_table(
                filter=pads.field("message_id") == message_id).to_pylist()
        except Exception:  # vacuumed or never there: the envelope rows, if any, still say
            rows = []
        for row in rows:
            if row.get("enqueued_at") is not None:
                enqueued.append((row["enqueued_at"], first.queue))
                batch = row.get("batch_id")
    if not enqueued:
        return None
    at, queue = min(enqueued)
    return JourneyEvent(at, "enqueued", queue, "inbound", "enqueued", batch_id=batch)


def _keyed(events: list[JourneyEvent], cycles: dict[tuple[str, int], datetime]) -> list[tuple[Any, JourneyEvent]]:
    """Events in the order they happened. A cycle stamps the rows it writes with its start, before
    its attempts started: a processed row is ordered after the attempts of its cycle (cycle_seq),
    a current row (where the message is now) after every attempt."""
    latest = max((e.at for e in events if e.kind == "attempt" and e.at is not None), default=None)
    keyed = []
    for e in events:
        at = e.at
        if at is not None and e.kind in ("poisoned", "dead_lettered", "quarantined", "waiting") and latest:
            at = max(at, latest)
        elif at is not None and e.kind in ("processed", "dropped", "duplicate") and e.cycle_seq is not None:
            at = max(at, cycles.get((e.queue, e.cycle_seq), at))
        keyed.append(((at is None, at, _ORDER.get(e.kind, 9)), e))
    keyed.sort(key=lambda pair: pair[0])
    return keyed


def _stay(queue: str, table: str, row: dict[str, Any]) -> JourneyEvent:
    error = (row.get("last_error_type"), row.get("last_error_message"))
    if table == DEAD_LETTER:
        return JourneyEvent(row["dead_lettered_at"], "dead_lettered", queue, table, f"reason {row['reason']}",
                            batch_id=row["batch_id"], from_table=row["from_table"], error_type=error[0],
                            error_message=error[1])
    if table == QUARANTINE:
        return JourneyEvent(row["quarantined_at"], "quarantined", queue, table, f"reason {row['reason']}",
                            batch_id=row["batch_id"], from_table=row["from_table"], error_type=error[0],
                            error_message=error[1])
    if table == POISON:
        return JourneyEvent(row["entered_at"], "poisoned", queue, table, "in poison", batch_id=row["batch_id"],
                            error_type=error[0], error_message=error[1])
    return JourneyEvent(row["entered_at"], "waiting", queue, table, f"waiting, due {when(row['due_at'])}",
                        batch_id=row["batch_id"])


def _attempt(queue: str, row: dict[str, Any]) -> JourneyEvent:
    delay = row.get("retry_delay_ms")
    detail = row["outcome"]
    if delay is not None:
        detail += f"; next retry cycle after {spoken(timedelta(milliseconds=delay))}"
    return JourneyEvent(row["started_at"], "attempt", queue, row["table"], detail,
                        retry_delay_s=None if delay is None else delay / 1000,
                        cycle=row["cycle"], cycle_seq=row.get("cycle_seq"), attempt=row["attempt"],
                        outcome=row["outcome"],
                        error_type=row.get("error_type"), error_message=row.get("error_message"),
                        run_id=row.get("run_id"))


def _redrives(declaration: Declaration, message_id: str, batches: set[str]) -> list[JourneyEvent]:
    """The redrives that took the message (named by id, or by the batch of its copy) and the undos
    of those; an undone redrive left no copy, so the versions it recorded say whether it took it."""
    found = []
    actions = list_actions(declaration)
    undos = {a.arguments.get("action_id"): a for a in actions if a.kind == "undo" and a.state == DONE}
    for action in actions:
        if action.kind != "redrive":
            continue
        args = action.arguments
        named = message_id in (args.get("selection", {}).get("ids") or []) or message_id in (args.get("replaced") or [])
        by_batch = any((name := BatchName.parse(b)) is not None and name.action_id == action.action_id
                       for b in batches)
        if not (named or by_batch or (action.state == UNDONE and _took(declaration, action, message_id))):
            continue
        target = args.get("to") or action.queue
        found.append(JourneyEvent(
            action.at, "redriven", action.queue, "inbound",
            f"from {action.queue}/{args.get('from')} to {target}/inbound ({action.state})",
            action_id=action.action_id, actor=action.actor, run_id=action.run_id, from_table=args.get("from")))
        undo = undos.get(action.action_id)
        if undo is not None:
            found.append(JourneyEvent(
                undo.at, "undone", action.queue, args.get("from"),
                f"redrive {action.action_id} undone: back in {action.queue}/{args.get('from')}",
                action_id=undo.action_id, actor=undo.actor, run_id=undo.run_id))
    return found


def _took(declaration: Declaration, action: Action, message_id: str) -> bool:
    """Whether the redrive `action` took the message from its source: there at the version before
    it, gone at the version after (the redrive held the queue's lease in between)."""
    source = action.arguments.get("from")
    versions = action.versions.get(f"{action.queue}/{source}") or {}
    before, after = versions.get("before"), versions.get("after")
    if source is None or before is None or after is None:
        return False
    tables = QueueTables.of(declaration, action.queue)
    try:
        return _holds(tables, source, before, message_id) and not _holds(tables, source, after, message_id)
    except Exception:  # noqa: BLE001 - a version vacuumed since: the journey goes on without it
        return False


def _holds(tables: QueueTables, table: str, version: int, message_id: str) -> bool:
    old = DeltaTable(tables.uri(table), version=version, storage_options=tables.storage_options)
    return int(old.to_pyarrow_dataset().count_rows(filter=pads.field("message_id") == message_id)) > 0


def _with_moves(keyed: list[tuple[Any, JourneyEvent]]) -> list[tuple[Any, JourneyEvent]]:
    """Add the moves that no row records: between the tables of consecutive attempts, and into the
    table a redrive took the message from (timed at the attempt after which its cycle routed it)."""
    out: list[tuple[Any, JourneyEvent]] = []
    last: tuple[Any, JourneyEvent] | None = None  # the last attempt not yet followed by where it went
    for key, event in keyed:
        if event.kind == "attempt":
            if last is not None and (last[1].queue, last[1].table) != (event.queue, event.table):
                out.append(_move(last, event.table))
            last = (key, event)
        elif event.kind == "redriven":
            if last is not None and last[1].table != event.from_table:
                out.append(_move(last, event.from_table))
            last = None
        elif event.kind in ("poisoned", "dead_lettered", "quarantined", "waiting", "processed", "dropped",
                            "duplicate"):
            last = None  # the row itself records where it went
        out.append((key, event))
    out.sort(key=lambda pair: pair[0])
    return out


def _move(attempt: tuple[Any, JourneyEvent], to: str | None) -> tuple[Any, JourneyEvent]:
    key, a = attempt
    event = JourneyEvent(a.at, "moved", a.queue, to, f"moved from {a.table} to {to}", cycle=a.cycle,
                         cycle_seq=a.cycle_seq, run_id=a.run_id, from_table=a.table, inferred=True)
    return (key[0], key[1], _ORDER["moved"]), event
