"""`redrive --ramp 1,10,100,all`: a canary redrive, in steps that grow, stopping by itself when the
messages it sends fail again (ServicePulse's most requested feature; spring-kafka's parking).

A ramp is one action (kind `ramp`) of the queue, kept `planned` while it runs. Its plan is the
messages selected when it started, each with its step: the first `steps[0]`, then up to `steps[1]` in
all, ... (`all`: the rest). Each step is sent as a redrive of its own (`<ramp id>--step<k>`, by ids).
The ramp is advanced by its completion, which the queue's next holder runs like every interrupted
action's (each cycle, each operator command), and by running it again with its id:

1. while the step's messages wait in the inbound (its redrive's batches), nothing more happens;
2. once a cycle took them, the step's messages that failed again in that cycle, with the same
   signature as before, are counted;
3. more than `max_failures` of them: the ramp stops. They are parked: moved back to the table the
   ramp took them from (reason `failed again after redrive`), from wherever their failure put them;
   the ramp is recorded done with `stopped_at_step`. Otherwise the next step is sent, or, after the
   last one, the ramp is recorded done.

Parking is two commits, each safe to repeat (an append under the app transaction
`poison_pipeline:parked/<ramp id>`, then the removal of what the append copied): a kill between them
leaves the ramp planned, and its next advance removes what is left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.names import ActionName, AppTransaction, BatchName
from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND, POISON, QUARANTINE
from poison_pipeline.operations.actions import (
    PLANNED,
    Action,
    Recorded,
    abandon_action,
    find_action,
    new_action_id,
    operator_writer,
    planned_actions,
)
from poison_pipeline.operations.batches import redrive_batches
from poison_pipeline.operations.selection import Selection, selected_at
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import ACTIONS, ATTEMPTS, QueueTables, schema_of
from poison_pipeline.storage.writer import QueueWriter

__all__ = ["RAMP", "RampResult", "advance_ramp", "advance_ramps", "complete_interrupted_ramp", "start_ramp"]

RAMP = "ramp"
RUNNING, COMPLETED, STOPPED = "running", "completed", "stopped"
PARKED_REASON = "failed again after redrive"
# The ids of the messages that failed again, as the ledger keeps them with a finished ramp.
FAILED_IDS_KEPT = 100


@dataclass
class RampResult:
    ramp_id: str | None  # None: nothing was selected (nothing recorded)
    queue: str
    source: str
    steps: list[int | None]  # the cumulative sizes; None: all
    state: str  # running, completed or stopped
    selected: int = 0  # the messages the ramp took, in all its steps
    step: int = 0  # the last step sent (1 for the first)
    sent: int = 0  # messages sent so far
    waiting: int = 0  # of the last step's, still waiting in the inbound for a cycle
    failed_again: list[str] = field(default_factory=list)  # of the last step evaluated
    parked: int = 0
    max_failures: int = 0


def start_ramp(declaration: Declaration, queue: str, source: str, selection: Selection, steps: Sequence[int | None],
               max_failures: int, ramp_id: str | None, actor: str, run_id: str,
               now: datetime | None = None) -> RampResult:
    """Start a ramp of `queue`'s `source` (or, given the id of one, advance it) and send its first step."""
    tables = QueueTables.of(declaration, queue)
    tables.ensure()
    now = now or datetime.now(UTC)
    with operator_writer(declaration, tables, RAMP, run_id, resuming=[ramp_id] if ramp_id else []) as writer:
        if ramp_id is not None and (record := Recorded.of(writer, RAMP, ramp_id)).action is not None:
            return advance_ramp(declaration, writer, record.action, run_id)
        ramp_id = ramp_id or new_action_id(RAMP)
        rows, version = selected_at(declaration, queue, source, selection)
        plan = _plan(rows, steps)
        if plan.num_rows == 0:
            return RampResult(None, queue, source, list(steps), COMPLETED, max_failures=max_failures)
        record = Recorded(writer, RAMP, ramp_id)
        record.begin(actor, {"queue": queue, "from": source, "steps": list(steps), "max_failures": max_failures,
                             "selection": selection.arguments(), "id": ramp_id}, [(tables, source), (tables, INBOUND)],
                     run_id, now)
        record.record_plan(plan, {source: version})
        assert record.action is not None
        return advance_ramp(declaration, writer, record.action, run_id)


def _plan(rows: pa.Table, steps: Sequence[int | None]) -> pa.Table:
    """Each selected message (oldest failure first) with the step that sends it."""
    numbers = [_step_of(index, steps) for index in range(rows.num_rows)]
    return pa.table({"message_id": rows["message_id"], "source_batch_id": rows["batch_id"],
                     "last_error_signature": rows["last_error_signature"], "step": pa.array(numbers, pa.int32())})


def _step_of(index: int, steps: Sequence[int | None]) -> int:
    """The step (1 for the first) that sends the `index`-th selected message."""
    return next(k for k, size in enumerate(steps, start=1) if size is None or index < size)


def step_sizes(steps: Sequence[int | None], selected: int) -> list[int]:
    """How many of `selected` messages each step would send (the steps that would send any)."""
    return list(Counter(_step_of(index, steps) for index in range(selected)).values())


def complete_interrupted_ramp(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> None:
    """A ramp in progress, advanced by its queue's next holder (a cycle, an operator command)."""
    advance_ramp(declaration, writer, action, run_id)


def advance_ramps(declaration: Declaration, writer: QueueWriter, run_id: str) -> None:
    """Advance the queue's ramps in progress: after a cycle's commit, its messages' fate is known."""
    # The ledger as the writer holds it: a cycle without ramps pays no load of it.
    for action in planned_actions(writer.tables, [RAMP], snapshot=writer.latest_if_exists(ACTIONS)):
        advance_ramp(declaration, writer, action, run_id)


def advance_ramp(declaration: Declaration, writer: QueueWriter, action: Action, run_id: str) -> RampResult:
    """Go on with ramp `action` as far as its messages allow (see the module's docstring)."""
    tables = writer.tables
    args = action.arguments
    source, steps, most = args["from"], args["steps"], int(args["max_failures"])
    record = Recorded(writer, RAMP, action.action_id, action)
    if record.finished:
        record.clear()
        return _result(action, None, RUNNING)
    plan = record.plan()
    if plan is None:  # killed before its plan: it sent nothing, and its id was never printed
        abandon_action(writer, action, "killed before it planned anything: nothing sent")
        return _result(action, None, STOPPED)
    rows = plan.rows
    sent_steps = [k for k in range(1, len(steps) + 1) if _step(tables, action.action_id, k) is not None]
    step = max(sent_steps, default=0)
    if step == 0:
        return _send(declaration, record, rows, 1, run_id)
    sub = _step(tables, action.action_id, step)
    assert sub is not None
    waiting = _waiting(tables, sub.action_id)
    if sub.state == PLANNED or waiting:
        return _result(action, rows, RUNNING, step=step, waiting=waiting)
    ids = rows.filter(pc.equal(rows["step"], step))
    failed = _failed_again(tables, ids, sub.finished_at or sub.at)
    if len(failed) > most:
        parked = _park(writer, source, failed, action.action_id)
        record.finish({"stopped_at_step": step, "failed_again": len(failed),
                       "failed_again_ids": failed[:FAILED_IDS_KEPT], "parked": parked,
                       "sent": _moved(tables, action.action_id, step)}, [(tables, source), (tables, INBOUND)])
        return _result(action, rows, STOPPED, step=step, failed=failed, parked=parked)
    return _send(declaration, record, rows, step + 1, run_id, failed)


def _step(tables: QueueTables, ramp_id: str, step: int) -> Action | None:
    """The redrive of step `step` of ramp `ramp_id`, by its name or as an earlier version named it."""
    for name in ActionName.parse(ramp_id).ramp_step(step).spellings():
        if (found := find_action(tables, name)) is not None:
            return found
    return None


def _send(declaration: Declaration, record: Recorded, rows: pa.Table, first: int, run_id: str,
          failed: list[str] | None = None) -> RampResult:
    """Send the ramp's next step from `first` on that has a message still in its table: a step whose
    messages all left it since (redriven, purged, archived) sends nothing and records no redrive, and
    the next is tried. After the last, the ramp is done."""
    # Imported here: a redrive's completion is among the interrupted actions this module's own
    # completion runs beside.
    from poison_pipeline.operations.redrive import redrive_table

    writer, action = record.writer, record.action
    assert action is not None
    args = action.arguments
    tables = writer.tables
    for step in range(first, len(args["steps"]) + 1):
        ids = tuple(rows.filter(pc.equal(rows["step"], step))["message_id"].to_pylist())
        if not ids:
            continue
        redrive_id = str(ActionName.parse(action.action_id).ramp_step(step))
        redrive_table(declaration, args["queue"], args["from"], Selection(ids=ids), redrive_id=redrive_id,
                      actor=action.actor, run_id=run_id, within=writer)
        if find_action(tables, redrive_id) is not None:
            return _result(action, rows, RUNNING, step=step, waiting=_waiting(tables, redrive_id))
    last = first - 1
    record.finish({"completed_steps": last, "failed_again": len(failed or []),
                   "failed_again_ids": (failed or [])[:FAILED_IDS_KEPT],
                   "sent": _moved(tables, action.action_id, last)}, [(tables, args["from"]), (tables, INBOUND)])
    return _result(action, rows, COMPLETED, step=last, failed=failed)


def _moved(tables: QueueTables, ramp_id: str, last: int) -> int:
    """How many messages the ramp's steps up to `last` sent: what their redrives moved."""
    steps = (_step(tables, ramp_id, k) for k in range(1, last + 1))
    return sum(int(step.counts.get("moved", 0)) for step in steps if step is not None)


def _sent(rows: pa.Table, step: int) -> int:
    return int(pc.sum(pc.less_equal(rows["step"], step)).as_py() or 0)


def _waiting(tables: QueueTables, redrive_id: str) -> int:
    """How many messages a step's redrive put in the inbound that no cycle has taken yet."""
    inbound = tables.open_if_exists(INBOUND)
    if inbound is None:
        return 0
    return int(inbound.to_pyarrow_dataset().count_rows(filter=redrive_batches(tables, tables.queue, redrive_id)))


def _failed_again(tables: QueueTables, step_rows: pa.Table, since: datetime) -> list[str]:
    """Of a step's messages, those whose first cycle after it was sent processed none of their
    attempts and whose last failure there has the signature they had before."""
    ledger = tables.open_if_exists(ATTEMPTS)
    if ledger is None or step_rows.num_rows == 0:
        return []
    attempts = ledger.to_pyarrow_dataset().to_table(
        columns=["message_id", "started_at", "cycle_seq", "attempt", "outcome", "error_signature"],
        filter=pads.field("message_id").isin(step_rows["message_id"].to_pylist())
        & (pads.field("started_at") >= pa.scalar(since, schemas.TS))).to_pylist()
    before = dict(zip(step_rows["message_id"].to_pylist(), step_rows["last_error_signature"].to_pylist(),
                      strict=True))
    first: dict[str, list[dict[str, object]]] = {}
    for row in sorted(attempts, key=lambda r: (r["cycle_seq"] or 0, r["attempt"])):
        tried = first.setdefault(str(row["message_id"]), [])
        if not tried or tried[0]["cycle_seq"] == row["cycle_seq"]:
            tried.append(row)
    return sorted(message for message, tried in first.items()
                  if all(r["outcome"] != "success" for r in tried) and tried[-1]["error_signature"] == before[message])


def _park(writer: QueueWriter, source: str, failed: list[str], ramp_id: str) -> int:
    """Move the messages that failed again back to `source` from wherever they are now; safe to repeat."""
    tables = writer.tables
    now = datetime.now(UTC)
    elsewhere = [t for t in (*tables.waiting, DEAD_LETTER, QUARANTINE) if t != source]
    found: list[tuple[str, pa.Table]] = []
    for table in elsewhere:
        there = tables.open_if_exists(table)
        if there is None:
            continue
        rows = there.to_pyarrow_dataset().to_table(filter=pads.field("message_id").isin(failed))
        if rows.num_rows:
            found.append((table, rows))
    # Parked by an earlier version and killed before the removal: it completes under its names.
    legacy = tables.open(source).transaction_version(AppTransaction.parked(ramp_id, legacy=True).name) is not None
    app_id = AppTransaction.parked(ramp_id, legacy=legacy).name
    batch = BatchName.parked(ramp_id).spelled(legacy=legacy)
    if found:
        copies = pa.concat_tables([_as_parked(rows, table, source, batch, now) for table, rows in found])
        writer.append(source, copies, app_id=app_id, version=1)
        for table, rows in found:
            writer.replace_batches(table, set(rows["batch_id"].to_pylist()),
                                   keep=~pads.field("message_id").isin(rows["message_id"].to_pylist()))
    # Parked: back in `source`, whether moved now or put there by their own failure.
    return int(tables.open(source).to_pyarrow_dataset().count_rows(filter=pads.field("message_id").isin(failed)))


def _as_parked(rows: pa.Table, table: str, source: str, batch: str, now: datetime) -> pa.Table:
    """Rows of `table` as rows of the failure table `source`, parked there now."""
    message = schemas.project(rows.select(schemas.MESSAGE.names), schemas.MESSAGE, batch_id=batch, entered_at=now,
                              due_at=now)
    if source == POISON:
        return message
    at = {DEAD_LETTER: "dead_lettered_at", QUARANTINE: "quarantined_at"}[source]
    extra = {"reason": PARKED_REASON, "from_table": table, at: now}
    return schemas.project(message, schema_of(source), **extra)


def _result(action: Action, rows: pa.Table | None, state: str, *, step: int = 0, waiting: int = 0,
            failed: list[str] | None = None, parked: int = 0) -> RampResult:
    args = action.arguments
    counts = action.counts
    return RampResult(
        action.action_id, args["queue"], args["from"], list(args["steps"]), state if rows is not None else
        (STOPPED if "stopped_at_step" in counts else COMPLETED),
        selected=rows.num_rows if rows is not None else int(counts.get("sent", 0)),
        step=step or int(counts.get("stopped_at_step", counts.get("completed_steps", 0))),
        sent=_sent(rows, step) if rows is not None else int(counts.get("sent", 0)),
        waiting=waiting, failed_again=failed or list(counts.get("failed_again_ids", [])),
        parked=parked or int(counts.get("parked", 0)),
        max_failures=int(args["max_failures"]))
