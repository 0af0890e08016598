"""Sensors that start cycles: arrival (inbound, poison) and retry-cycle (each retry subqueue).
They read the Delta transaction log only (row counts and due times from file statistics), never
Spark or data files, so an evaluation stays fast with millions of waiting messages.
"""


import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from dagster import (
    AssetCheckEvaluation,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from poison_pipeline.defs.checks import user_code_evaluation
from poison_pipeline.defs.naming import PROBE_TAG, QUEUE_TAG, job_name, sensor_name
from poison_pipeline.defs.waiting_runs import run_waiting
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.outage import probed
from poison_pipeline.domain.policy import Policy
from poison_pipeline.domain.routing import INBOUND, POISON
from poison_pipeline.operations.interrupted import interrupted_actions
from poison_pipeline.storage.control import queue_state
from poison_pipeline.storage.events import events_version
from poison_pipeline.storage.faults import redacted_failures
from poison_pipeline.storage.tables import ACTIONS, EVENTS, TRANSMISSION, QueueTables
from poison_pipeline.views.user_code import CodeProblem


@dataclass(frozen=True)
class Decision:
    run_key: str | None
    cursor: dict[str, Any]
    skip: str | None
    # The run requested is a probe of a queue an outage disabled (`outage_recovery: probe`).
    probe: bool = False


def parse_cursor(raw: str | None) -> dict[str, Any]:
    """The JSON cursor; an unreadable one counts as a first evaluation rather than an error."""
    try:
        cursor = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return cursor if isinstance(cursor, dict) else {}


# What an evaluation saw, kept in the cursor: while none of it can have changed, the next evaluation
# gives the same answer without reading the log (`_still`).
_SEEN = ("version", "waiting", "due", "next_due", "run_key", "log_mark", "events_mark", "disabled", "interrupted",
         "actions_mark")


def decide(tables: QueueTables, table: str, cursor: dict[str, Any], now: datetime,
           last_run_failed: bool = False, policy: Policy | None = None) -> Decision:
    """Whether `table` has due messages that no run was requested for yet, or whose requested run
    ended without success (`last_run_failed`: killed, failed or canceled). With the queue's
    `policy`: whether an inbound an outage disabled is due for a probe."""
    decision = _decide(tables, table, cursor, now, last_run_failed)
    if table != INBOUND or policy is None:
        return decision
    return _probe(tables, decision, cursor, policy, now)


def _probe(tables: QueueTables, decision: Decision, cursor: dict[str, Any], policy: Policy,
           now: datetime) -> Decision:
    """A probe run every `probe.interval` while an outage keeps the queue disabled: counted from
    the last probe requested, or from when this sensor first saw the queue disabled."""
    kept = {key: value for key, value in decision.cursor.items() if key not in _PROBE_KEYS}
    if not probed(policy, decision.cursor.get("disabled") is None, decision.cursor.get("disabled")):
        return Decision(decision.run_key, kept, decision.skip)
    since = cursor.get("probed_at") or cursor.get("disabled_since") or now.isoformat()
    kept.update(disabled_since=cursor.get("disabled_since") or now.isoformat(), probed_at=cursor.get("probed_at"))
    due = datetime.fromisoformat(since) + policy.probe.interval
    if now < due:
        return Decision(None, kept, f"{decision.skip}; next probe at {due.isoformat()}")
    kept["probed_at"] = now.isoformat()
    return Decision(f"{tables.queue}/{INBOUND}/probe-{now.isoformat()}", kept, None, probe=True)


def _decide(tables: QueueTables, table: str, cursor: dict[str, Any], now: datetime,
            last_run_failed: bool) -> Decision:
    if _still(tables, table, cursor, now):
        return _answer(tables, table, {key: cursor[key] for key in _SEEN} | {
            "last_run_key": cursor.get("last_run_key")}, cursor, last_run_failed)
    try:
        # Opening the table once says whether it exists too: a table of 10,000 commits costs an open.
        stats = tables.stats(table, now)
    except FileNotFoundError:
        return Decision(None, cursor, f"{tables.queue}/{table} does not exist yet: nothing enqueued")
    state = queue_state(tables)
    digest = hashlib.sha1(",".join(stats.due_batches).encode()).hexdigest()[:12]
    # An operator action a kill left half done is completed by the queue's next cycle, before it
    # selects anything: the inbound's sensor requests that cycle even when nothing is due, so the
    # action does not wait for the queue's next message.
    interrupted, actions_version = interrupted_actions(tables) if table == INBOUND else (0, None)
    base = {
        "version": stats.version,
        "waiting": stats.rows,
        "due": stats.due_rows,
        "next_due": stats.next_due.isoformat() if stats.next_due else None,
        # The same version and due batches always give the same key: Dagster launches a key once.
        "run_key": f"{tables.queue}/{table}/v{stats.version}/{digest}" if stats.due_rows else None,
        "log_mark": tables.log_mark(table, stats.version),
        "events_mark": tables.log_mark(EVENTS, state.version),
        # Said in the cursor too: what waits in a disabled queue waits for an operator, not a clock.
        "disabled": None if state.enabled else state.reason or "disabled",
        "interrupted": interrupted,
        "actions_mark": tables.log_mark(ACTIONS, actions_version),
        "last_run_key": cursor.get("last_run_key"),
    }
    if interrupted and not stats.due_rows:
        base["run_key"] = f"{tables.queue}/{table}/actions-v{actions_version}"
    return _answer(tables, table, base, cursor, last_run_failed)


def _still(tables: QueueTables, table: str, cursor: dict[str, Any], now: datetime) -> bool:
    """Whether what the last evaluation saw still holds: neither the table nor the queue's state
    has a commit since, and no waiting message came due. A few requests on an object store, where
    reading the log costs one per commit since its last checkpoint."""
    if not all(key in cursor for key in _SEEN) or not cursor["log_mark"]:
        return False
    if cursor["next_due"] and datetime.fromisoformat(cursor["next_due"]) <= now:
        return False
    return (tables.unchanged_since(table, cursor["log_mark"]) and tables.unchanged_since(EVENTS, cursor["events_mark"])
            and (table != INBOUND or tables.unchanged_since(ACTIONS, cursor["actions_mark"])))


def _answer(tables: QueueTables, table: str, base: dict[str, Any], cursor: dict[str, Any],
            last_run_failed: bool) -> Decision:
    if base["disabled"] is not None:
        return Decision(None, base, f"queue {tables.queue!r} is disabled: {base['disabled']}")
    if not base["due"] and base["interrupted"]:
        key = base["run_key"]
        return _request(key, base, cursor, last_run_failed,
                        f"{base['interrupted']} interrupted action(s) of {tables.queue}: a cycle to complete "
                        f"them was already requested ({key})")
    if not base["due"]:
        when = f"; next due at {base['next_due']}" if base["next_due"] else ""
        return Decision(None, base, f"{base['waiting']} waiting in {tables.queue}/{table}, none due{when}")
    key = base["run_key"]
    return _request(key, base, cursor, last_run_failed, f"a run was already requested for {key}")


def _request(run_key: str, base: dict[str, Any], cursor: dict[str, Any], last_run_failed: bool,
             already: str) -> Decision:
    """A run for `run_key` unless one was requested for it; again if that one ended badly."""
    last = cursor.get("last_run_key") or ""
    if last != run_key and not last.startswith(f"{run_key}/again-"):
        return Decision(run_key, {**base, "last_run_key": run_key}, None)
    if not last_run_failed:
        return Decision(None, base, already)
    # A run that died leaves the table as it was (its cycle is completed by the next one): the same
    # state gets a new key, or its messages would wait for an unrelated change.
    again = int(last.rpartition("/again-")[2]) + 1 if last != run_key else 1
    run_key = f"{run_key}/again-{again}"
    return Decision(run_key, {**base, "last_run_key": run_key}, None)


# What a probe keeps in the inbound sensor's cursor: when it first saw the queue disabled, and
# when it last requested a probe.
_PROBE_KEYS = ("disabled_since", "probed_at")

_ENDED_BADLY = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)


def run_ended_badly(instance: DagsterInstance, run_key: str | None) -> bool:
    """Whether the latest run launched for `run_key` ended without success."""
    if not run_key:
        return False
    runs = instance.get_runs(RunsFilter(tags={"dagster/run_key": run_key}), limit=1)
    return bool(runs) and runs[0].status in _ENDED_BADLY


# Dagster's daemon evaluates sensors on a loop of 5 s, each no sooner than its minimum interval
# after the previous one: an interval a second short of the wanted one lands on the loop's tick
# instead of the tick after it.
_LOOP_SLACK_SECONDS = 1


def look_every_seconds(declaration: Declaration, queue: str, table: str) -> int:
    """How often the sensor of `queue`/`table` evaluates: the queue's `latency.look_every`, else
    30 s for the inbound and the transmission queue, 60 s for retry subqueues and the poison table."""
    chosen = declaration.queue(queue).latency.look_every
    if chosen is not None:
        return math.ceil(chosen.total_seconds())
    return 30 if table in (INBOUND, TRANSMISSION) else 60


def _minimum_interval(declaration: Declaration, queue: str, table: str) -> int:
    return look_every_seconds(declaration, queue, table) - _LOOP_SLACK_SECONDS


# The inbound sensor's cursor key for the user_code check it reported last: the problem's text, or
# None once it reported the code importing again.
_CODE_REPORTED = "user_code_reported"


def waiting_sensor(declaration: Declaration, queue: str, table: str,
                   code_problem: CodeProblem | None = None) -> SensorDefinition:
    """The sensor of `queue`/`table`. With a `code_problem` (the queue's code does not import in the
    code location) it requests nothing and says why; the inbound's sensor also reports the queue's
    failing `user_code` check, once per problem, and its passing once the code imports again."""
    kind = "arrival" if table in (INBOUND, POISON) else "retry-cycle"
    job = job_name(queue, table)

    @sensor(
        name=sensor_name(queue, table),
        job_name=job,
        minimum_interval_seconds=_minimum_interval(declaration, queue, table),
        default_status=DefaultSensorStatus.RUNNING,
        description=f"The {kind} sensor of {queue}/{table}: requests a cycle when messages are due.",
    )
    @redacted_failures()  # the daemon logs an error with its causes: no credentials in them
    def evaluate(context: SensorEvaluationContext) -> SensorResult:
        cursor = parse_cursor(context.cursor)
        reported = _code_reported(queue, table, cursor, code_problem)
        if code_problem is not None:
            return SensorResult(
                skip_reason=SkipReason(f"{queue}'s code does not import, so no cycle of it runs: {code_problem}"),
                cursor=json.dumps({**cursor, _CODE_REPORTED: str(code_problem)}, sort_keys=True),
                asset_events=reported)
        if run_waiting(context.instance, job):
            return SensorResult(skip_reason=SkipReason(f"a run of {job} waits to start: it takes what is due"),
                                asset_events=reported)
        tables = QueueTables.of(declaration, queue)
        failed = run_ended_badly(context.instance, cursor.get("last_run_key"))
        decision = decide(tables, table, cursor, datetime.now(UTC), failed, declaration.queue(queue).policy)
        kept = json.dumps(decision.cursor, sort_keys=True)
        if decision.run_key is None:
            return SensorResult(skip_reason=SkipReason(decision.skip), cursor=kept, asset_events=reported)
        request = RunRequest(run_key=decision.run_key,
                             tags={QUEUE_TAG: queue, **({PROBE_TAG: "true"} if decision.probe else {})})
        return SensorResult(run_requests=[request], cursor=kept, asset_events=reported)

    return evaluate


def _code_reported(queue: str, table: str, cursor: dict[str, Any], problem: CodeProblem | None
                   ) -> list[AssetCheckEvaluation]:
    """The user_code check evaluation the inbound's sensor reports now: a problem it has not
    reported yet, or the code importing after it reported a problem. The cursor that decide()
    writes drops the key, so a problem cleared is reported once."""
    if table != INBOUND:
        return []
    said = cursor.get(_CODE_REPORTED)
    if problem is not None and said != str(problem):
        return [user_code_evaluation(queue, problem)]
    if problem is None and said is not None:
        return [user_code_evaluation(queue, None)]
    return []


def decide_transmission(declaration: Declaration, queue: str, cursor: dict[str, Any], now: datetime,
                        last_run_failed: bool = False) -> Decision:
    """Whether the transmission queue has messages a new offer could move: it changed, a queue it
    may send to changed state, or a conversation's lifetime ran out (or the last offer ended badly)."""
    tables = QueueTables.of(declaration, queue)
    if not tables.exists(TRANSMISSION):
        return Decision(None, cursor, f"{queue} has sent nothing yet")
    log = tables.open(TRANSMISSION)
    actions = pa.table(log.get_add_actions(flatten=True))
    pending = sum(actions.column("num_records").to_pylist()) if actions.num_rows else 0
    base = {"version": log.version(), "pending": pending, "last_run_key": cursor.get("last_run_key")}
    if pending == 0:
        return Decision(None, base, f"nothing waits in {queue}'s transmission queue")
    column = "min.deadline"
    deadlines = [d for d in actions.column(column).to_pylist() if d] if column in actions.column_names else []
    expired = bool(deadlines) and min(deadlines) <= now
    # A target's events table changes when it is enabled or disabled: a reason to offer again.
    states = {q: events_version(QueueTables.of(declaration, q)) for q in declaration.queues}
    digest = hashlib.sha1(json.dumps([states, expired], sort_keys=True).encode()).hexdigest()[:12]
    run_key = f"{queue}/{TRANSMISSION}/v{log.version()}/{digest}"
    return _request(run_key, base, cursor, last_run_failed,
                    f"{pending} waiting; an offer was already requested for {run_key}")


def transmission_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    @sensor(
        name=sensor_name(queue, TRANSMISSION),
        job_name=job_name(queue, TRANSMISSION),
        minimum_interval_seconds=_minimum_interval(declaration, queue, TRANSMISSION),
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Offers {queue}'s sent messages to their targets again when something changed.",
    )
    @redacted_failures()  # the daemon logs an error with its causes: no credentials in them
    def evaluate(context: SensorEvaluationContext) -> SensorResult:
        cursor = parse_cursor(context.cursor)
        failed = run_ended_badly(context.instance, cursor.get("last_run_key"))
        decision = decide_transmission(declaration, queue, cursor, datetime.now(UTC), failed)
        kept = json.dumps(decision.cursor, sort_keys=True)
        if decision.run_key is None:
            return SensorResult(skip_reason=SkipReason(decision.skip), cursor=kept)
        return SensorResult(run_requests=[RunRequest(run_key=decision.run_key, tags={QUEUE_TAG: queue})],
                            cursor=kept)

    return evaluate
