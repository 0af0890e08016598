"""Whether a queue is enabled, kept as events in the queue's events table (who, when, why)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from poison_pipeline.domain.alerts import QUEUE_RECOVERED
from poison_pipeline.storage import schemas
from poison_pipeline.storage.faults import writing
from poison_pipeline.storage.files import rows_where_in
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline.storage.writer import QueueWriter, queue_writer

QUEUE_DISABLED = "queue_disabled"
QUEUE_ENABLED = "queue_enabled"
# QUEUE_RECOVERED (domain/alerts.py): a probe's enable, of its own kind so that it is alerted apart
# from an operator's `enable`.
# A probe that found the outage going on: the queue stays disabled (not a toggle, not alerted).
PROBE_FAILED = "probe_failed"


@dataclass(frozen=True)
class QueueState:
    enabled: bool
    reason: str | None = None
    since: datetime | None = None
    actor: str | None = None
    version: int | None = None  # of the events table it was read from; None: no events table yet


def event_row(kind: str, at: datetime, actor: str, reason: str, message_id: str | None = None,
              table: str | None = None, **cycle: object) -> dict[str, object]:
    """A row of the events table; `cycle` are the messages_failed columns (run_id, cycle_seq, failures)."""
    return {
        "event_id": f"evt-{uuid.uuid4().hex}",
        "kind": kind,
        "at": at,
        "actor": actor,
        "reason": reason,
        "message_id": message_id,
        "table": table,
        **cycle,
    }


def _state_app(tables: QueueTables) -> str:
    return f"poison_pipeline/{tables.queue}/queue_state"


def _state_event_id(version: int) -> str:
    return f"evt-queue_state-{version}"


def state_commit(tables: QueueTables, rows: list[dict[str, object]], enabled: bool) -> tuple[pa.Table, Transaction]:
    """The events of one enable or disable and the app transaction that makes it the queue's state.

    The state is the transaction's version in the newest commit that carries it (Delta's log order,
    whatever the clocks that stamped the rows): odd when enabled, even when disabled. Two toggles
    committed from one snapshot conflict, so one of them is retried on the newer state."""
    committed = tables.open(EVENTS).transaction_version(_state_app(tables))
    version = 2 * ((committed or 0) // 2 + 1) + int(enabled)
    # The first row is the one the state points at: its reason, actor and time describe it.
    named = [{**rows[0], "event_id": _state_event_id(version)}, *rows[1:]]
    return pa.Table.from_pylist(named, schema=schemas.EVENTS), Transaction(_state_app(tables), version)


def queue_state(tables: QueueTables, *, snapshot: DeltaTable | None = None) -> QueueState:
    """Whether the queue is enabled, and why not. `snapshot`: the events table as the caller holds
    it (a writer's `latest_if_exists`), else it is loaded."""
    events = snapshot if snapshot is not None else tables.open_if_exists(EVENTS)
    if events is None:
        return QueueState(enabled=True)
    version = events.transaction_version(_state_app(tables))
    if version is None:
        return _state_by_time(tables, events)
    # Sensors ask on every evaluation: only the files whose statistics may hold the event are read.
    found = rows_where_in(tables.uri(EVENTS), tables.storage_options, events, "event_id",
                          [_state_event_id(version)], schemas.EVENTS)
    row = found.to_pylist()[0] if found.num_rows else {"reason": None, "at": None, "actor": None}
    return QueueState(version % 2 == 1, row["reason"], row["at"], row["actor"], events.version())


def _state_by_time(tables: QueueTables, events: DeltaTable) -> QueueState:
    """A lake whose toggles were all written before states followed commit order (or a queue never
    toggled, the usual case): the newest toggle event, read from the files that may hold one."""
    toggles = rows_where_in(tables.uri(EVENTS), tables.storage_options, events, "kind",
                            [QUEUE_DISABLED, QUEUE_ENABLED, QUEUE_RECOVERED], schemas.EVENTS)
    if toggles.num_rows == 0:
        return QueueState(enabled=True, version=events.version())
    last = toggles.sort_by([("at", "descending")]).slice(0, 1).to_pylist()[0]
    return QueueState(last["kind"] != QUEUE_DISABLED, last["reason"], last["at"], last["actor"], events.version())


class StateNotRecorded(RuntimeError):
    """An enable or disable was committed but the queue's state does not show it."""


def set_enabled(tables: QueueTables, enabled: bool, actor: str, reason: str, run_id: str = "manual", *,
                within: QueueWriter | None = None) -> bool:
    """Record an enable or disable under the queue's lease; returns False (and writes nothing) when
    already in that state. Reads the state back and raises StateNotRecorded if it does not show it."""
    tables.ensure()
    kind = QUEUE_ENABLED if enabled else QUEUE_DISABLED
    action = "enable" if enabled else "disable"
    with queue_writer(tables, action, run_id, within=within) as writer:
        for _ in range(5):
            if queue_state(tables).enabled == enabled:
                return False
            data, transaction = state_commit(tables, [event_row(kind, datetime.now(UTC), actor, reason)], enabled)
            try:
                writer.check()
                target = tables.open(EVENTS)
                # An events table made before the messages_failed columns gains them.
                with writing(f"recording the queue {action}d", tables.describe(EVENTS)):
                    write_deltalake(target, data, mode="append", schema_mode="merge",
                                    commit_properties=writer.properties(target, EVENTS, [transaction]))
            except CommitFailedError:
                continue  # another toggle committed from the same state: decide again on the newer one
            if queue_state(tables).enabled != enabled:
                raise StateNotRecorded(f"queue {tables.queue!r}: the {action} was committed but the queue still "
                                       f"reads {'disabled' if enabled else 'enabled'}; run `status` and try again")
            return True
    raise StateNotRecorded(f"queue {tables.queue!r}: the {action} kept conflicting with other commits; try again")
