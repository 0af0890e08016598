"""The notification for disabled queues (Service Broker's BROKER_QUEUE_DISABLED event notification).

One sensor per queue reads that queue's events table with delta-rs and raises each `queue_disabled`
event once, as a run of the queue's alert job: the run calls the declared alert hook, then fails, so
it shows as a failure in the UI and whatever run-failure alerting the user set up fires.
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
    OpExecutionContext,
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

from poison_pipeline.defs.naming import ALERT_TAG, EVENT_TAG, alert_job_name, alert_sensor_name
from poison_pipeline.defs.sensors import parse_cursor
from poison_pipeline.domain.alerts import QueueEvent
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.imports import import_callable
from poison_pipeline.storage.control import QUEUE_DISABLED
from poison_pipeline.storage.events import events_after, events_version
from poison_pipeline.storage.tables import QueueTables


class AlertConfig(Config):
    """The event an alert run raises; the sensor fills it in, so the run's config shows it."""

    event_id: str
    kind: str = QUEUE_DISABLED
    at: str
    actor: str | None = None
    reason: str | None = None
    message_id: str | None = None
    table: str | None = None

    def event(self, queue: str) -> QueueEvent:
        return QueueEvent(queue, self.event_id, self.kind, datetime.fromisoformat(self.at), self.actor,
                          self.reason, self.message_id, self.table)


@dataclass(frozen=True)
class AlertDecision:
    events: list[QueueEvent]
    cursor: dict[str, Any]
    skip: str | None
    note: str | None = None


def decide_alerts(tables: QueueTables, cursor: dict[str, Any]) -> AlertDecision:
    """The queue_disabled events of `tables` committed since the cursor's version, oldest first."""
    raised = int(cursor.get("raised", 0))
    last = {"raised": raised, "last_event_id": cursor.get("last_event_id"),
            "last_event_at": cursor.get("last_event_at")}
    seen = cursor.get("version")
    version = events_version(tables)
    if version is None:
        return AlertDecision([], {**last, "version": None},
                             f"queue {tables.queue!r} has no events table yet: it was never disabled")
    if version == seen:
        # The log alone says nothing was committed: no data file is opened.
        return AlertDecision([], {**last, "version": version},
                             f"no new event in {tables.queue}/events (version {version})")
    new = events_after(tables, seen if isinstance(seen, int) else None, QUEUE_DISABLED)
    next_cursor = {**last, "version": new.version, "raised": raised + len(new.events)}
    if not new.events:
        return AlertDecision([], next_cursor,
                             f"no new queue_disabled event in {tables.queue}/events (version {new.version})")
    newest = new.events[-1]
    next_cursor.update(last_event_id=newest.event_id, last_event_at=newest.at.isoformat())
    note = None
    if not new.incremental:
        note = (f"{tables.queue}/events: the commits after version {seen} are gone (log cleaned up or "
                "table recreated), so every queue_disabled event is requested again; run keys keep "
                "the ones already raised from running twice")
    return AlertDecision(new.events, next_cursor, None, note)


def _request(queue: str, event: QueueEvent) -> RunRequest:
    config = {k: v for k, v in event.as_dict().items() if k != "queue"}
    return RunRequest(
        # An event id names one event forever: Dagster never launches a run key of a sensor twice,
        # even if a rewritten events table or a lost cursor makes the sensor see the event again.
        run_key=event.event_id,
        run_config={"ops": {_op_name(queue): {"config": config}}},
        tags={ALERT_TAG: queue, EVENT_TAG: event.event_id},
    )


def _op_name(queue: str) -> str:
    return f"{queue}__raise_queue_disabled"


def queue_disabled_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    @sensor(
        name=alert_sensor_name(queue),
        job_name=alert_job_name(queue),
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"The notification sensor of {queue}: raises each queue_disabled event once, "
                    "as a failed alert run.",
    )
    def evaluate(context: SensorEvaluationContext) -> SensorResult:
        decision = decide_alerts(QueueTables.of(declaration, queue), parse_cursor(context.cursor))
        cursor = json.dumps(decision.cursor, sort_keys=True)
        if decision.note:
            context.log.warning(decision.note)
        if not decision.events:
            return SensorResult(skip_reason=SkipReason(decision.skip), cursor=cursor)
        return SensorResult(run_requests=[_request(queue, e) for e in decision.events], cursor=cursor)

    return evaluate


def _failure_metadata(event: QueueEvent, hook: str | None, hook_error: str | None) -> dict[str, Any]:
    values = {**event.as_dict(), "alert_hook": hook or "none declared", "alert_hook_error": hook_error}
    return {k: MetadataValue.text(v) for k, v in values.items() if v is not None}


def queue_disabled_job(declaration: Declaration, queue: str) -> JobDefinition:
    hook = declaration.alert_hook

    @op(name=_op_name(queue), description=f"Calls the alert hook with a queue_disabled event of {queue}, "
                                          "then fails the run with its reason.")
    def raise_queue_disabled(context: OpExecutionContext, config: AlertConfig) -> None:
        event = config.event(queue)
        message = event.describe()
        hook_error: str | None = None
        cause: Exception | None = None
        if hook is not None:
            try:
                import_callable(hook)(event)
            except Exception as error:
                cause, hook_error = error, f"{type(error).__name__}: {error}"
                message += f"; the alert hook {hook} failed too: {hook_error}"
            else:
                context.log.info(f"alert hook {hook} called for event {event.event_id}")
        # Failing is the alert: the run shows red in the UI and run-failure sensors and hooks fire.
        raise Failure(description=message, metadata=_failure_metadata(event, hook, hook_error),
                      allow_retries=False) from cause

    @job(
        name=alert_job_name(queue),
        description=f"Raises one queue_disabled event of {queue} as a failed run, after the alert hook.",
        tags={ALERT_TAG: queue},
        executor_def=in_process_executor,
    )
    def alert() -> None:
        raise_queue_disabled()

    return alert
