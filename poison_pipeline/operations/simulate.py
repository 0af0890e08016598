"""`simulate`: what a candidate policy would have done with the attempts a queue recorded.

Read with delta-rs and pyarrow, no Spark, changing nothing: the attempts ledger (the application
queue's tables: inbound and retry subqueues; attempts during an outage were not charged and are left
out), and where each message that failed is now (poison, dead_letter, quarantine, the waiting tables,
the processed ledger's rows that were not plain successes) for what was recorded. Each message's
first journey through the queue is replayed under the candidate (`domain.simulation.replay`); a
message that succeeded at its first attempt is processed under any policy and is counted without
being replayed. A journey is simulated when its first attempt is in the window (`since`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.errors import RecordedClassifier, group_id
from poison_pipeline.domain.policy import Policy
from poison_pipeline.domain.routing import DEAD_LETTER, POISON, PROCESSED, QUARANTINE
from poison_pipeline.domain.simulation import ASSUMPTIONS, Fates, Tried, replay
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables

__all__ = ["REDRIVEN", "ELSEWHERE", "Simulation", "SimulationRow", "simulate"]

# What was recorded, besides the fates a replay gives: sent back by an operator after its first
# journey (its later journeys are not replayed), or in none of the places read (purged since).
REDRIVEN = "redriven"
ELSEWHERE = "elsewhere"
# The group of messages that never failed.
NO_GROUP = "-"
_COLUMNS = ["message_id", "table", "cycle", "attempt", "started_at", "cycle_seq", "duration_ms", "outcome",
            "error_type", "error_code", "error_signature"]


@dataclass(frozen=True)
class SimulationRow:
    """The messages of one type whose last recorded failure is in one failure group (`-`: none)."""

    message_type: str
    group: str
    messages: int
    simulated: dict[str, int]
    recorded: dict[str, int]
    # Under the candidate: attempts on average, and the time to the fate (median, longest), in seconds.
    attempts_mean: float
    seconds_median: float
    seconds_max: float
    # Messages for which the candidate made attempts that never happened (see the assumptions).
    assumed: int


@dataclass(frozen=True)
class Simulation:
    queue: str
    since: datetime | None
    messages: int
    attempts: int
    simulated: dict[str, int]
    recorded: dict[str, int]
    # Messages whose simulated fate differs from the recorded one (redriven and elsewhere left out).
    changed: int
    rows: tuple[SimulationRow, ...]
    assumptions: tuple[str, ...] = ASSUMPTIONS
    policy: dict[str, Any] = field(default_factory=dict)


def simulate(declaration: Declaration, queue: str, policy: Policy, *, since: datetime | None = None) -> Simulation:
    """Replay `queue`'s recorded attempts since `since` (all, when None) under `policy`."""
    tables = QueueTables.of(declaration, queue)
    attempts = _attempts(tables, since)
    journeys = _Journeys(attempts)
    classifier = RecordedClassifier(policy.unrecoverable, policy.rules)
    failing = journeys.failing()
    recorded, quarantined = _recorded(tables, journeys, failing)
    poison = declaration.queues[queue].poison_queue
    firsts = journeys.first_success()
    done = int(firsts.sum())
    # Most journeys succeeded at their first attempt: processed under any policy, counted in columns.
    at_once = pa.table({
        "message_id": pa.array(journeys.ids[journeys.starts[firsts]], pa.string()),
        "group": pa.repeat(pa.scalar(NO_GROUP), done), "fate": pa.repeat(pa.scalar(Fates.PROCESSED.value), done),
        "recorded": pa.repeat(pa.scalar(Fates.PROCESSED.value), done), "attempts": pa.repeat(pa.scalar(1), done),
        "seconds": pa.array(journeys.first_seconds[firsts], pa.float64()), "assumed": pa.repeat(pa.scalar(False), done),
        "changed": pa.repeat(pa.scalar(False), done)})
    replayed: dict[str, list[Any]] = {name: [] for name in at_once.column_names}
    for index, (tried, signature) in zip(failing.tolist(), journeys.tried(failing, classifier), strict=True):
        message = journeys.ids[journeys.starts[index]]
        fate = replay(policy, message, tried, finished=recorded[message] != Fates.WAITING)
        # Compared as journeys through the application queue; shown as where the message is: one the
        # poison queue quarantined since (it has no handler) is quarantined, and so is its simulated
        # journey if that also ends in poison.
        shown = Fates.QUARANTINED if message in quarantined and poison.handler is None else recorded[message]
        simulated = shown if fate.outcome == recorded[message] == Fates.POISONED else fate.outcome.value
        for name, value in (("message_id", message), ("group", group_id(signature) if signature else NO_GROUP),
                            ("fate", simulated), ("recorded", shown),
                            ("attempts", fate.attempts), ("seconds", fate.seconds), ("assumed", fate.assumed > 0),
                            ("changed", recorded[message] not in (REDRIVEN, ELSEWHERE)
                             and recorded[message] != fate.outcome.value)):
            replayed[name].append(value)
    per_message = pa.concat_tables([at_once, pa.table(replayed, schema=at_once.schema)]).join(
        _message_types(tables, journeys), "message_id", join_type="left outer")
    per_message = per_message.set_column(per_message.schema.get_field_index("message_type"), "message_type",
                                         pc.fill_null(per_message["message_type"], "?"))
    return Simulation(queue, since, per_message.num_rows, attempts.num_rows,
                      _counts(per_message, "fate"), _counts(per_message, "recorded"),
                      int(pc.sum(per_message["changed"]).as_py() or 0), _rows(per_message),
                      policy=policy.model_dump(mode="json", exclude_defaults=True))


def _counts(per_message: pa.Table, column: str) -> dict[str, int]:
    counted = per_message.group_by(column, use_threads=False).aggregate([([], "count_all")])
    return dict(zip(counted[column].to_pylist(), counted["count_all"].to_pylist(), strict=True))


def _rows(per_message: pa.Table) -> tuple[SimulationRow, ...]:
    keys = ["message_type", "group"]
    totals = per_message.group_by(keys, use_threads=False).aggregate([
        ([], "count_all"), ("attempts", "sum"), ("seconds", "approximate_median"), ("seconds", "max"),
        ("assumed", "sum")]).to_pylist()
    by_fate: dict[tuple[str, str], dict[str, dict[str, int]]] = defaultdict(lambda: {"fate": {}, "recorded": {}})
    for column in ("fate", "recorded"):
        counted = per_message.group_by([*keys, column], use_threads=False).aggregate([([], "count_all")])
        for row in counted.to_pylist():
            by_fate[(row["message_type"], row["group"])][column][row[column]] = row["count_all"]
    made = []
    for t in totals:
        fates = by_fate[(t["message_type"], t["group"])]
        made.append(SimulationRow(
            t["message_type"], t["group"], t["count_all"], fates["fate"], fates["recorded"],
            round(t["attempts_sum"] / t["count_all"], 3), round(t["seconds_approximate_median"], 3),
            round(t["seconds_max"], 3), int(t["assumed_sum"])))
    return tuple(sorted(made, key=lambda r: (-r.messages, r.message_type, r.group)))


def _attempts(tables: QueueTables, since: datetime | None) -> pa.Table:
    """The charged attempts in the application queue's tables, by message and in the order made."""
    ledger = tables.open_if_exists(ATTEMPTS)
    if ledger is None:
        return pa.table({name: pa.array([], pa.string()) for name in _COLUMNS})
    dataset = ledger.to_pyarrow_dataset()
    columns = [c for c in _COLUMNS if c in dataset.schema.names]
    where = pc.field("table").isin([t for t in tables.waiting if t != POISON]) & (pc.field("outcome") != "outage")
    if since is not None:
        where = where & (pc.field("started_at") >= pa.scalar(since, dataset.schema.field("started_at").type))
    table = dataset.to_table(columns=columns, filter=where)
    if "error_code" not in table.column_names:  # a ledger written before codes were recorded
        table = table.append_column("error_code", pa.nulls(table.num_rows, pa.string()))
    order = pc.sort_indices(table, [("message_id", "ascending"), ("started_at", "ascending"),
                                    ("cycle_seq", "ascending"), ("attempt", "ascending")])
    return table.take(order)


class _Journeys:
    """Each message's first journey through the queue: its attempts until an operator sent it back
    to the start (an attempt of the inbound cycle after one of a later cycle, or a first attempt again)."""

    def __init__(self, attempts: pa.Table) -> None:
        self.attempts = attempts
        self.ids = np.asarray(attempts["message_id"].to_numpy(zero_copy_only=False), dtype=object)
        n = len(self.ids)
        cycles = attempts["cycle"].to_numpy(zero_copy_only=False).astype(np.int64) if n else np.zeros(0, np.int64)
        numbers = attempts["attempt"].to_numpy(zero_copy_only=False).astype(np.int64) if n else np.zeros(0, np.int64)
        new_message = np.ones(n, dtype=bool)
        if n:
            new_message[1:] = self.ids[1:] != self.ids[:-1]
        back = np.zeros(n, dtype=bool)
        if n:
            back[1:] = (cycles[1:] < cycles[:-1]) | ((cycles[1:] == 0) & (numbers[1:] == 1))
        restart = back & ~new_message
        message_starts = np.flatnonzero(new_message)
        # A message whose journey started before the window (its first attempt here is not the
        # inbound's first) is left out.
        whole = (cycles[message_starts] == 0) & (numbers[message_starts] == 1) if n else np.zeros(0, bool)
        self.starts = message_starts[whole]
        ends = np.append(message_starts[1:], n)[whole]
        # The journey ends at the first restart of the message.
        restarts = np.flatnonzero(restart)
        later = np.searchsorted(restarts, self.starts, side="right")
        first_restart = np.where(later < len(restarts), restarts[np.minimum(later, len(restarts) - 1)], n) \
            if len(restarts) else np.full(len(self.starts), n)
        self.redriven = first_restart < ends
        self.ends = np.minimum(ends, first_restart)
        self.outcomes = attempts["outcome"].to_numpy(zero_copy_only=False)
        self.durations = np.nan_to_num(attempts["duration_ms"].to_numpy(zero_copy_only=False).astype(float)) / 1000 \
            if n else np.zeros(0)
        self.first_seconds = self.durations[self.starts] if n else np.zeros(0)

    def first_success(self) -> np.ndarray:
        """Journeys of one attempt that succeeded (most messages): processed under any policy."""
        if not len(self.starts):
            return np.zeros(0, dtype=bool)
        once: np.ndarray = ((self.ends - self.starts) == 1) & (self.outcomes[self.starts] == "success") & ~self.redriven
        return once

    def failing(self) -> np.ndarray:
        return np.flatnonzero(~self.first_success())

    def tried(self, failing: np.ndarray, classifier: RecordedClassifier) -> Iterator[tuple[list[Tried], str | None]]:
        """The attempts of each journey of `failing` as the replay takes them, and its last failure's
        signature, in the order of `failing`."""
        lengths = self.ends[failing] - self.starts[failing]
        firsts = np.cumsum(lengths) - lengths
        rows = np.repeat(self.starts[failing], lengths) + np.arange(int(lengths.sum())) - np.repeat(firsts, lengths)
        columns = self.attempts.take(pa.array(rows)).select(
            ["outcome", "error_type", "error_code", "error_signature"]).to_pydict()
        outcomes, kinds, codes, signatures = (columns[c] for c in ("outcome", "error_type", "error_code",
                                                                   "error_signature"))
        seconds = self.durations[rows].tolist()
        # Few distinct errors recur: each is classified once.
        decided: dict[tuple[str | None, str | None], tuple[int | None, bool]] = {}
        for first, length in zip(firsts.tolist(), lengths.tolist(), strict=True):
            tried = []
            signature = None
            for k in range(first, first + length):
                if outcomes[k] == "success":
                    tried.append(Tried(False, seconds[k]))
                    continue
                key = (kinds[k], codes[k])
                if key not in decided:
                    decided[key] = (classifier.rule(*key), classifier.unrecoverable(*key))
                signature = signatures[k]
                tried.append(Tried(True, seconds[k], *decided[key]))
            yield tried, signature

    def last_table(self, index: int) -> str:
        return str(self.attempts["table"][int(self.ends[index]) - 1].as_py())


def _recorded(tables: QueueTables, journeys: _Journeys, failing: np.ndarray) -> tuple[dict[str, str], set[str]]:
    """Where each failing message's first journey was recorded to end (`Fates`, or REDRIVEN, ELSEWHERE),
    and the messages quarantined by the poison queue since."""
    wanted = pa.array(sorted({journeys.ids[journeys.starts[i]] for i in failing.tolist()}), pa.string())
    places: dict[str, str] = {}

    def rows(table: str, columns: list[str]) -> list[dict[str, Any]]:
        opened = tables.open_if_exists(table)
        if opened is None or not len(wanted):
            return []
        found = opened.to_pyarrow_dataset().to_table(columns=columns, filter=pc.field("message_id").isin(wanted))
        listed: list[dict[str, Any]] = found.to_pylist()
        return listed

    for row in rows(PROCESSED, ["message_id", "disposition", "from_table"]):
        if row["from_table"] == POISON:
            places[row["message_id"]] = Fates.POISONED
        elif row["disposition"] == "dropped":
            places[row["message_id"]] = Fates.DROPPED
    quarantined: set[str] = set()
    for row in rows(QUARANTINE, ["message_id", "from_table"]):
        places[row["message_id"]] = Fates.POISONED if row["from_table"] == POISON else Fates.QUARANTINED
        if row["from_table"] == POISON:
            quarantined.add(row["message_id"])
    for row in rows(DEAD_LETTER, ["message_id", "from_table"]):
        places[row["message_id"]] = Fates.POISONED if row["from_table"] == POISON else Fates.DEAD_LETTERED
    for row in rows(POISON, ["message_id"]):
        places[row["message_id"]] = Fates.POISONED
    waiting = {t: {r["message_id"] for r in rows(t, ["message_id"])} for t in tables.waiting if t != POISON}
    fates: dict[str, str] = {}
    for index in failing.tolist():
        message = journeys.ids[journeys.starts[index]]
        place = places.get(message)
        if journeys.redriven[index]:
            place = REDRIVEN
        elif journeys.outcomes[int(journeys.ends[index]) - 1] == "success":
            place = Fates.PROCESSED
        elif place is None:
            where = next((t for t, ids in waiting.items() if message in ids), None)
            # Still in the table of its last attempt: its cycle faulted (and disabled the queue).
            place = (ELSEWHERE if where is None else Fates.FAULTED if where == journeys.last_table(index)
                     else Fates.WAITING)
        fates[message] = place
    return fates, quarantined & {m for m, fate in fates.items() if fate == Fates.POISONED}


def _message_types(tables: QueueTables, journeys: _Journeys) -> pa.Table:
    """Each message's type, from the processed ledger and the tables that hold the message (one
    row per message id; the join with the journeys leaves out the others)."""
    parts = []
    for table in (PROCESSED, *tables.waiting, DEAD_LETTER, QUARANTINE):
        opened = tables.open_if_exists(table)
        if opened is None or not len(journeys.starts):
            continue
        dataset = opened.to_pyarrow_dataset()
        if "message_type" in dataset.schema.names:
            parts.append(dataset.to_table(columns=["message_id", "message_type"]))
    if not parts:
        return pa.table({"message_id": pa.array([], pa.string()), "message_type": pa.array([], pa.string())})
    found = pa.concat_tables(parts)
    return found.group_by("message_id", use_threads=False).aggregate([("message_type", "first")]).rename_columns(
        ["message_id", "message_type"])
