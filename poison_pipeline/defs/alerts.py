"""Notifications: Service Broker's BROKER_QUEUE_DISABLED event notification, and one for failures.

Per queue and event kind, a sensor reads that queue's events table with delta-rs and raises each
event once, as a run of the kind's alert job, which calls the declared alert hook:
- `queue_disabled`: the run then fails, so it shows as a failure in the UI and whatever run-failure
  alerting the user set up fires;
- `messages_failed` (one per cycle that poisoned, dead-lettered or quarantined messages, written by
  the cycle's own commit): the run succeeds, showing the cycle's failures per group and a link to
  the cycle's run; it fails only when the hook does.
"""


import json
from dataclasses import dataclass
from datetime import datetime
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
from poison_pipeline.defs.naming import ALERT_TAG, EVENT_TAG, alert_job_name, alert_sensor_name
from poison_pipeline.defs.sensors import parse_cursor
from poison_pipeline.domain.alerts import MESSAGES_FAILED, FailureCount, QueueEvent
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.imports import import_callable
from poison_pipeline.storage.control import QUEUE_DISABLED
from poison_pipeline.storage.events import events_after, events_version
from poison_pipeline.storage.tables import QueueTables


class FailureCountConfig(Config):
    """How many messages the cycle sent to one failure table in one failure group."""

    table: str
    group: str
    count: int
    error: str
    example_id: str | None = None


class AlertConfig(Config):
    """The event an alert run raises; the sensor fills it in, so the run's config shows it."""

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


@dataclass(frozen=True)
class AlertDecision:
    events: list[QueueEvent]
    cursor: dict[str, Any]
    skip: str | None
    note: str | None = None


# Why a queue without an events table has nothing to raise yet.
_NOTHING_YET = {QUEUE_DISABLED: "it was never disabled", MESSAGES_FAILED: "no cycle of it has failed a message"}


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
    next_cursor = {**last, "version": new.version, "raised": raised + len(new.events)}
    if not new.events:
        return AlertDecision([], next_cursor,
                             f"no new {kind} event in {tables.queue}/events (version {new.version})")
    newest = new.events[-1]
    next_cursor.update(last_event_id=newest.event_id, last_event_at=newest.at.isoformat())
    note = None
    if not new.incremental:
        note = (f"{tables.queue}/events: the commits after version {seen} are gone (log cleaned up or "
                f"table recreated), so every {kind} event is requested again; run keys keep "
                "the ones already raised from running twice")
    return AlertDecision(new.events, next_cursor, None, note)


def _op_name(queue: str, kind: str) -> str:
    return f"{queue}__raise_{kind}"


def _request(queue: str, event: QueueEvent) -> RunRequest:
    config = {k: v for k, v in event.as_dict().items() if k != "queue"}
    return RunRequest(
        # An event id names one event forever: Dagster never launches a run key of a sensor twice,
        # even if a rewritten events table or a lost cursor makes the sensor see the event again.
        run_key=event.event_id,
        run_config={"ops": {_op_name(queue, event.kind): {"config": config}}},
        tags={ALERT_TAG: queue, EVENT_TAG: event.event_id},
    )


_SENSOR_DESCRIPTIONS = {
    QUEUE_DISABLED: "raises each queue_disabled event once, as a failed alert run.",
    MESSAGES_FAILED: "raises each cycle that poisoned, dead-lettered or quarantined messages once, as an alert run.",
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
        if not decision.events:
            return SensorResult(skip_reason=SkipReason(decision.skip), cursor=cursor)
        return SensorResult(run_requests=[_request(queue, e) for e in decision.events], cursor=cursor)

    return evaluate


def queue_disabled_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    return alert_sensor(declaration, queue, QUEUE_DISABLED)


def messages_failed_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    return alert_sensor(declaration, queue, MESSAGES_FAILED)


def _call_hook(context: OpExecutionContext, hook: str | None, event: QueueEvent) -> tuple[Exception | None, str]:
    """Call the declared hook with `event`: what it raised, and that as text ("" when it did not)."""
    if hook is None:
        return None, ""
    try:
        import_callable(hook)(event)
    except Exception as error:
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


def queue_disabled_job(declaration: Declaration, queue: str) -> JobDefinition:
    hook = declaration.alert_hook

    @op(name=_op_name(queue, QUEUE_DISABLED),
        description=f"Calls the alert hook with a queue_disabled event of {queue}, then fails the run with its reason.")
    def raise_queue_disabled(context: OpExecutionContext, config: AlertConfig) -> None:
        event = config.event(queue)
        message = event.describe()
        cause, hook_error = _call_hook(context, hook, event)
        if hook_error:
            message += f"; the alert hook {hook} failed too: {hook_error}"
        # Failing is the alert: the run shows red in the UI and run-failure sensors and hooks fire.
        raise Failure(description=message, metadata=_failure_metadata(event, hook, hook_error),
                      allow_retries=False) from cause

    return _alert_job(queue, QUEUE_DISABLED, raise_queue_disabled,
                      f"Raises one queue_disabled event of {queue} as a failed run, after the alert hook.")


def _failed_cycle_metadata(event: QueueEvent, hook: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "event": MetadataValue.text(event.describe()),
        "cycle_table": MetadataValue.text(event.table or ""),
        "cycle_seq": MetadataValue.int(event.cycle_seq or 0),
        "failed_messages": MetadataValue.int(sum(f.count for f in event.failures)),
        "failure_groups": MetadataValue.int(len({f.group for f in event.failures})),
        "failures": MetadataValue.md(failure_counts_markdown(event.failures)),
        "alert_hook": MetadataValue.text(hook or "none declared"),
    }
    # A cycle run outside Dagster (the CLI, a script) has no run page to link to.
    if event.run_id and event.run_id != "manual":
        metadata["cycle_run"] = MetadataValue.dagster_run(event.run_id)
    else:
        metadata["cycle_run_id"] = MetadataValue.text(event.run_id or "")
    return metadata


def messages_failed_job(declaration: Declaration, queue: str) -> JobDefinition:
    hook = declaration.alert_hook

    @op(name=_op_name(queue, MESSAGES_FAILED), out=Out(None),
        description=f"Calls the alert hook with what one cycle of {queue} failed, per failure group.")
    def raise_messages_failed(context: OpExecutionContext, config: AlertConfig) -> Output[None]:
        event = config.event(queue)
        context.log.warning(event.describe())
        cause, hook_error = _call_hook(context, hook, event)
        if hook_error:
            raise Failure(description=f"{event.describe()}; the alert hook {hook} failed: {hook_error}",
                          metadata=_failure_metadata(event, hook, hook_error), allow_retries=False) from cause
        return Output(None, metadata=_failed_cycle_metadata(event, hook))

    return _alert_job(queue, MESSAGES_FAILED, raise_messages_failed,
                      f"Raises one cycle of {queue} that failed messages, after the alert hook.")
