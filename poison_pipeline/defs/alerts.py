"""Notifications: Service Broker's BROKER_QUEUE_DISABLED event notification, and one for failures.

Per queue and event kind, a sensor reads that queue's events table with delta-rs and raises each
event once, in a run of the kind's alert job, which calls the declared alert hook once per event:
- `queue_disabled`: one run per event, which then fails, so it shows as a failure in the UI and
  whatever run-failure alerting the user set up fires;
- `messages_failed` (one per cycle that poisoned, dead-lettered or quarantined messages, written by
  the cycle's own commit): the events an evaluation finds share one run (up to `_BATCH`), so a
  queue failing a message every cycle raises a run per sensor interval, not one per cycle. The run
  succeeds, showing each cycle's failures per group and a link to the cycle's run; it fails only
  when the hook does. A failed message is raised once, when it first fails: the poison cycle's
  quarantining (or dead-lettering) of messages raised when they were poisoned raises nothing more.
"""


import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    Config,
    DefaultSensorStatus,
    Failure,
    JobDefinition,
    MetadataValue,
    OpDefinition,
    OpExecutionContext,
    Out,
    Output,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    in_process_executor,
    job,
    op,
    sensor,
)
from pydantic import Field

from poison_pipeline.defs.failure_metadata import failure_counts_markdown
from poison_pipeline.defs.naming import (
    ALERT_TAG,
    EVENT_TAG,
    RUN_KEY_TAG,
    SENSOR_NAME_TAG,
    alert_job_name,
    alert_sensor_name,
)
from poison_pipeline.defs.sensors import parse_cursor
from poison_pipeline.domain.alerts import (
    ACTION_LEFT,
    MESSAGES_FAILED,
    QUEUE_RECOVERED,
    FailureCount,
    QueueEvent,
    merged_failures,
)
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import POISON
from poison_pipeline.domain.user_code import call_hook
from poison_pipeline.storage.control import QUEUE_DISABLED
from poison_pipeline.storage.events import events_after, events_version
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.views.user_code import CodeProblem


class FailureCountConfig(Config):
    """How many messages the cycle sent to one failure table in one failure group."""

    table: str
    group: str
    count: int
    error: str
    example_id: str | None = None


class EventConfig(Config):
    """One event an alert run raises."""

    event_id: str
    kind: str = QUEUE_DISABLED
    at: str
    actor: str | None = None
    reason: str | None = None
    message_id: str | None = None
    table: str | None = None
    run_id: str | None = None
    cycle_seq: int | None = None
    failures: list[FailureCountConfig] = Field(default_factory=list)

    def event(self, queue: str) -> QueueEvent:
        failures = tuple(FailureCount(**f.model_dump()) for f in self.failures)
        return QueueEvent(queue, self.event_id, self.kind, datetime.fromisoformat(self.at), self.actor,
                          self.reason, self.message_id, self.table, self.run_id, self.cycle_seq, failures)


class AlertConfig(Config):
    """The events an alert run raises, oldest first; the sensor fills them in, so the run's config
    shows them."""

    events: list[EventConfig]

    def queue_events(self, queue: str) -> list[QueueEvent]:
        return [event.event(queue) for event in self.events]


@dataclass(frozen=True)
class AlertDecision:
    events: list[QueueEvent]
    cursor: dict[str, Any]
    skip: str | None
    note: str | None = None


# Why a queue without an events table has nothing to raise yet.
_NOTHING_YET = {QUEUE_DISABLED: "it was never disabled", MESSAGES_FAILED: "no cycle of it has failed a message",
                QUEUE_RECOVERED: "no probe has resumed it", ACTION_LEFT: "no interrupted action of it was left"}


def decide_alerts(tables: QueueTables, cursor: dict[str, Any], kind: str = QUEUE_DISABLED) -> AlertDecision:
    """The `kind` events of `tables` committed since the cursor's version, oldest first.

    The cursor is the events table's Delta version, so an evaluation reads the log, and the data
    files of the commits after that version only. Each event is raised once: its run key is its
    event id, which Dagster never launches twice for a sensor, even when a stale or lost cursor
    shows the sensor the event again."""
    raised = int(cursor.get("raised", 0))
    last = {"raised": raised, "last_event_id": cursor.get("last_event_id"),
            "last_event_at": cursor.get("last_event_at")}
    seen = cursor.get("version")
    version = events_version(tables)
    if version is None:
        return AlertDecision([], {**last, "version": None},
                             f"queue {tables.queue!r} has no events table yet: {_NOTHING_YET[kind]}")
    if version == seen:
        # The log alone says nothing was committed: no data file is opened.
        return AlertDecision([], {**last, "version": version},
                             f"no new event in {tables.queue}/events (version {version})")
    new = events_after(tables, seen if isinstance(seen, int) else None, kind)
    events = [e for e in new.events if raises_alert(e)]
    next_cursor = {**last, "version": new.version, "raised": raised + len(events)}
    if not events:
        skip = f"no new {kind} event in {tables.queue}/events (version {new.version})"
        if new.events:
            skip = (f"{len(new.events)} new {kind} event(s) in {tables.queue}/events (version {new.version}), "
                    f"each of a {POISON} cycle: its messages were raised when they were poisoned")
        return AlertDecision([], next_cursor, skip)
    newest = events[-1]
    next_cursor.update(last_event_id=newest.event_id, last_event_at=newest.at.isoformat())
    note = None
    if not new.incremental:
        note = (f"{tables.queue}/events: the commits after version {seen} are gone (log cleaned up or "
                f"table recreated), so every {kind} event is requested again; run keys keep "
                "the ones already raised from running twice")
    return AlertDecision(events, next_cursor, None, note)


def raises_alert(event: QueueEvent) -> bool:
    """Whether `event` raises an alert: every kind does, but a `messages_failed` event of the poison
    cycle, whose messages failed before (they were raised when poisoned)."""
    return event.kind != MESSAGES_FAILED or event.table != POISON


def _op_name(queue: str, kind: str) -> str:
    return f"{queue}__raise_{kind}"


# At most this many messages_failed events share a run (its config holds them all).
_BATCH = 100

# Given a run key, the ids of the events the sensor's run of that key raises, or None when it has
# no run of that key.
Raised = Callable[[str], set[str] | None]


def batches(events: list[QueueEvent], raised: Raised, size: int) -> list[list[QueueEvent]]:
    """`events` (oldest first) in runs of up to `size`, none already raised.

    A run's key is its first event's id, which Dagster never launches twice for a sensor. When a
    stale or lost cursor shows the sensor events again, the run of the first one's key may already
    exist and hold more events than that one: `raised` says which, and they are left out, so every
    event is still raised once whatever the batches were when its run was requested."""
    left, runs = list(events), []
    while left:
        covered = raised(left[0].event_id)
        if covered is None:
            runs.append(left[:size])
            left = left[size:]
        else:
            covered.add(left[0].event_id)
            left = [event for event in left if event.event_id not in covered]
    return runs


def _request(queue: str, events: list[QueueEvent]) -> RunRequest:
    first = events[0]
    return RunRequest(
        run_key=first.event_id,
        run_config={"ops": {_op_name(queue, first.kind): {"config": {
            "events": [{k: v for k, v in event.as_dict().items() if k != "queue"} for event in events]}}}},
        tags={ALERT_TAG: queue, EVENT_TAG: first.event_id},
    )


def _raised_by_runs(context: SensorEvaluationContext, sensor_name: str, op_name: str) -> Raised:
    def raised(run_key: str) -> set[str] | None:
        runs = context.instance.get_runs(RunsFilter(tags={RUN_KEY_TAG: run_key, SENSOR_NAME_TAG: sensor_name}),
                                         limit=1)
        if not runs:
            return None
        config: Any = runs[0].run_config or {}
        events = config.get("ops", {}).get(op_name, {}).get("config", {}).get("events", [])
        return {event["event_id"] for event in events if isinstance(event, dict) and "event_id" in event}

    return raised


_SENSOR_DESCRIPTIONS = {
    QUEUE_DISABLED: "raises each queue_disabled event once, as a failed alert run.",
    MESSAGES_FAILED: "raises each cycle that poisoned, dead-lettered or quarantined messages once, as an alert run.",
    QUEUE_RECOVERED: "raises each resumption of the queue by a probe once, as an alert run.",
    ACTION_LEFT: "raises each interrupted action left for an operator once, as a failed alert run.",
}


def alert_sensor(declaration: Declaration, queue: str, kind: str) -> SensorDefinition:
    @sensor(
        name=alert_sensor_name(queue, kind),
        job_name=alert_job_name(queue, kind),
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"The notification sensor of {queue}: {_SENSOR_DESCRIPTIONS[kind]}",
    )
    def evaluate(context: SensorEvaluationContext) -> SensorResult:
        decision = decide_alerts(QueueTables.of(declaration, queue), parse_cursor(context.cursor), kind)
        cursor = json.dumps(decision.cursor, sort_keys=True)
        if decision.note:
            context.log.warning(decision.note)
        runs = batches(decision.events, _raised_by_runs(context, alert_sensor_name(queue, kind), _op_name(queue, kind)),
                       _BATCH if kind == MESSAGES_FAILED else 1)
        if not runs:
            return SensorResult(skip_reason=SkipReason(decision.skip or "every new event was raised already"),
                                cursor=cursor)
        return SensorResult(run_requests=[_request(queue, events) for events in runs], cursor=cursor)

    return evaluate


# A queue whose code does not import where the code location loads: no event of its lake says so
# (none of its cycles runs), so the code location raises it.
USER_CODE_BROKEN = "user_code_broken"


def user_code_broken_sensor(queue: str, problem: CodeProblem) -> SensorDefinition:
    """Raises `problem` once, as a failed alert run: its run key is the problem's, so a location
    reloaded with the same problem raises nothing new, and another problem raises again."""
    event_id = f"{USER_CODE_BROKEN}:{hashlib.sha1(str(problem).encode()).hexdigest()[:16]}"

    @sensor(name=alert_sensor_name(queue, USER_CODE_BROKEN), job_name=alert_job_name(queue, USER_CODE_BROKEN),
            minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
            description=f"The notification sensor of {queue}: raises its code not importing once, as a failed "
            "alert run.")
    def evaluate(context: SensorEvaluationContext) -> RunRequest:
        event = QueueEvent(queue, event_id, USER_CODE_BROKEN, datetime.now(UTC), None,
                           f"{queue}'s code does not import, so no cycle of it runs: {problem}")
        return _request(queue, [event])

    return evaluate


def user_code_broken_job(declaration: Declaration, queue: str) -> JobDefinition:
    return _failing_job(declaration, queue, USER_CODE_BROKEN, "its code not importing")


def queue_disabled_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    return alert_sensor(declaration, queue, QUEUE_DISABLED)


def messages_failed_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    return alert_sensor(declaration, queue, MESSAGES_FAILED)


def queue_recovered_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    return alert_sensor(declaration, queue, QUEUE_RECOVERED)


def action_left_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    return alert_sensor(declaration, queue, ACTION_LEFT)


def _call_hook(context: OpExecutionContext, hook: str | None, timeout: timedelta, event: QueueEvent
               ) -> tuple[Exception | None, str]:
    """Call the declared hook with `event` within `timeout`: what it raised, and that as text (""
    when it did not)."""
    if hook is None:
        return None, ""
    error = call_hook(hook, timeout, event)
    if error is not None:
        return error, f"{type(error).__name__}: {error}"
    context.log.info(f"alert hook {hook} called for event {event.event_id}")
    return None, ""


def _failure_metadata(event: QueueEvent, hook: str | None, hook_error: str) -> dict[str, Any]:
    values = {**event.as_dict(), "alert_hook": hook or "none declared", "alert_hook_error": hook_error or None}
    values["failures"] = json.dumps(values["failures"]) if values["failures"] else None
    return {k: MetadataValue.text(str(v)) for k, v in values.items() if v is not None}


def _alert_job(queue: str, kind: str, body: OpDefinition, description: str) -> JobDefinition:
    @job(name=alert_job_name(queue, kind), description=description, tags={ALERT_TAG: queue},
         executor_def=in_process_executor)
    def alert() -> None:
        body()

    return alert


def _failing_job(declaration: Declaration, queue: str, kind: str, what: str) -> JobDefinition:
    """The alert job of an event someone must act on: it calls the hook, then fails the run."""
    hook = declaration.alert_hook

    @op(name=_op_name(queue, kind),
        description=f"Calls the alert hook with {what} of {queue}, then fails the run with its reason.")
    def raise_failing(context: OpExecutionContext, config: AlertConfig) -> None:
        # The sensor gives one event a run; a run launched by hand may give more.
        messages, metadata, causes = [], {}, []
        for event in config.queue_events(queue):
            cause, hook_error = _call_hook(context, hook, declaration.hook_timeout, event)
            message = event.describe()
            if hook_error:
                message += f"; the alert hook {hook} failed too: {hook_error}"
            messages.append(message)
            metadata = _failure_metadata(event, hook, hook_error)
            causes.append(cause)
        # Failing is the alert: the run shows red in the UI and run-failure sensors and hooks fire.
        raise Failure(description="\n".join(messages), metadata=metadata,
                      allow_retries=False) from next((c for c in causes if c is not None), None)

    return _alert_job(queue, kind, raise_failing, f"Raises one {kind} event of {queue} as a failed run, after the "
                      "alert hook.")


def queue_disabled_job(declaration: Declaration, queue: str) -> JobDefinition:
    return _failing_job(declaration, queue, QUEUE_DISABLED, "a queue_disabled event")


def action_left_job(declaration: Declaration, queue: str) -> JobDefinition:
    return _failing_job(declaration, queue, ACTION_LEFT, "an interrupted action left for an operator")


def _failed_cycles_metadata(events: list[QueueEvent], hook: str | None) -> dict[str, Any]:
    failures = merged_failures([failure for event in events for failure in event.failures])
    last = events[-1]
    metadata: dict[str, Any] = {
        "event": MetadataValue.text("\n".join(event.describe() for event in events)),
        "cycles": MetadataValue.int(len(events)),
        "cycle_table": MetadataValue.text(", ".join(dict.fromkeys(event.table or "" for event in events))),
        "cycle_seq": MetadataValue.int(last.cycle_seq or 0),
        "failed_messages": MetadataValue.int(sum(f.count for f in failures)),
        "failure_groups": MetadataValue.int(len({f.group for f in failures})),
        "failures": MetadataValue.md(failure_counts_markdown(failures)),
        "alert_hook": MetadataValue.text(hook or "none declared"),
    }
    # A cycle run outside Dagster (the CLI, a script) has no run page to link to.
    if last.run_id and last.run_id != "manual":
        metadata["cycle_run"] = MetadataValue.dagster_run(last.run_id)
    else:
        metadata["cycle_run_id"] = MetadataValue.text(last.run_id or "")
    if len(events) > 1:
        metadata["cycle_runs"] = MetadataValue.text(", ".join(dict.fromkeys(event.run_id or "" for event in events)))
    return metadata


def _tell(context: OpExecutionContext, declaration: Declaration, events: list[QueueEvent],
          log: Callable[[str], None]) -> None:
    """Log each event and call the alert hook with it; the run fails (once every event was told)
    if the hook failed for any: the alert did not reach anyone."""
    hook = declaration.alert_hook
    failed: list[tuple[QueueEvent, Exception, str]] = []
    for event in events:
        log(event.describe())
        cause, hook_error = _call_hook(context, hook, declaration.hook_timeout, event)
        if cause is not None:
            failed.append((event, cause, hook_error))
    if failed:
        event, cause, hook_error = failed[0]
        told = "; ".join(f"{e.describe()}; the alert hook {hook} failed: {error}" for e, _, error in failed)
        raise Failure(description=told, metadata=_failure_metadata(event, hook, hook_error),
                      allow_retries=False) from cause


def messages_failed_job(declaration: Declaration, queue: str) -> JobDefinition:
    hook = declaration.alert_hook

    @op(name=_op_name(queue, MESSAGES_FAILED), out=Out(None),
        description=f"Calls the alert hook with what each cycle of {queue} failed, per failure group.")
    def raise_messages_failed(context: OpExecutionContext, config: AlertConfig) -> Output[None]:
        events = config.queue_events(queue)
        _tell(context, declaration, events, context.log.warning)
        return Output(None, metadata=_failed_cycles_metadata(events, hook))

    return _alert_job(queue, MESSAGES_FAILED, raise_messages_failed,
                      f"Raises the cycles of {queue} that failed messages, after the alert hook.")


def queue_recovered_job(declaration: Declaration, queue: str) -> JobDefinition:
    hook = declaration.alert_hook

    @op(name=_op_name(queue, QUEUE_RECOVERED), out=Out(None),
        description=f"Calls the alert hook with a resumption of {queue} by a probe.")
    def raise_queue_recovered(context: OpExecutionContext, config: AlertConfig) -> Output[None]:
        events = config.queue_events(queue)
        _tell(context, declaration, events, context.log.info)
        return Output(None, metadata={"event": MetadataValue.text("\n".join(e.describe() for e in events)),
                                      "alert_hook": MetadataValue.text(hook or "none declared")})

    return _alert_job(queue, QUEUE_RECOVERED, raise_queue_recovered,
                      f"Raises each resumption of {queue} by a probe, after the alert hook.")
