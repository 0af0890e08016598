"""Operator actions as jobs with typed run config (the Launchpad): enable, end-conversation, edit,
purge and undo of one queue, each calling the function the CLI calls and recorded in the queue's
actions ledger with the actor and the run id. One job per queue and action, so every run carries
the queue's tag (dagster.yaml: one run per queue at a time)."""

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal, Self

from dagster import (
    Config,
    JobDefinition,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    in_process_executor,
    job,
    op,
)
from pydantic import Field, field_validator, model_validator

from poison_pipeline.broker.conversations import check_end_request
from poison_pipeline.defs.naming import QUEUE_TAG, operator_job_name, operator_op_name
from poison_pipeline.defs.run_config import ACTOR_HELP, actor_of, root_run_id
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.actions import find_action
from poison_pipeline.operations.edit import edit
from poison_pipeline.operations.enable import enable
from poison_pipeline.operations.end_conversation import end_conversation_by_operator
from poison_pipeline.operations.purge import PurgeOptions, PurgeRequest, format_purge, purge
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.operations.undo import UndoError, find_recorded, undo
from poison_pipeline.storage.tables import QueueTables


def _blank(name: str, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise ValueError(f"the {name} is empty")
    return value


class EnableConfig(Config):
    reason: str = Field(default="re-enabled from Dagster", description="Why the queue is resumed.")
    actor: str | None = Field(default=None, description="Who enables it; default: the run's user tag.")

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        return _blank("reason", value) or value


class EndConversationConfig(Config):
    conversation_id: str
    code: int = Field(description="Positive for application errors, negative for Service Broker's.")
    description: str
    actor: str | None = None


class EditConfig(Config):
    message_id: str
    body: str = Field(description="The new body: text, or base64 with encoding base64 (binary bodies).")
    encoding: Literal["utf-8", "base64"] = Field(default="utf-8", description="How `body` is written.")
    headers: dict[str, str] = Field(default_factory=dict, description="Headers set; the others are kept.")
    source: str | None = Field(default=None, description="poison, dead_letter or quarantine, if the "
                               "message is in several.")
    edit_id: str | None = Field(default=None, description="Default: derived from the message and the new body.")
    actor: str | None = None

    @field_validator("source")
    @classmethod
    def _source(cls, value: str | None) -> str | None:
        if value is not None and value not in FAILURE_TABLES:
            raise ValueError(f"{value!r}: choose {', '.join(FAILURE_TABLES)}")
        return value

    @model_validator(mode="after")
    def _decodable(self) -> Self:
        self.body_bytes()
        return self

    def body_bytes(self) -> bytes:
        if self.encoding == "utf-8":
            return self.body.encode("utf-8")
        try:
            return base64.b64decode(self.body, validate=True)
        except binascii.Error as error:
            raise ValueError(f"body is not base64 ({error}), as encoding 'base64' says") from None


class PurgeConfig(Config, PurgeOptions):
    actor: str | None = Field(default=None, description=ACTOR_HELP)


class UndoConfig(Config):
    action_id: str = Field(description="A redrive, edit or purge of this queue (see `poison-pipeline actions`).")
    actor: str | None = None


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)))


def _output(result: Any, **numbers: int) -> Output:
    metadata: dict[str, Any] = {name: MetadataValue.int(int(count)) for name, count in numbers.items()}
    metadata["result"] = MetadataValue.json(_jsonable(asdict(result)))
    return Output(None, metadata=metadata)


def _enable(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: EnableConfig) -> Output:
        result = enable(declaration, queue, actor_of(context, config.actor), config.reason, run_id=context.run.run_id)
        context.log.info(f"queue {queue!r} enabled ({'it was disabled' if result.changed else 'it was enabled'}); "
                         f"action {result.action.action_id}")
        return _output(result, changed=result.changed)

    return run


def _end_conversation(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: EndConversationConfig) -> Output:
        actor = actor_of(context, config.actor)
        check_end_request(declaration, queue, config.conversation_id, config.code, config.description, actor)
        ended = end_conversation_by_operator(declaration, queue, config.conversation_id, config.code,
                                             config.description, actor, run_id=context.run.run_id)
        if ended.result.hook_error:
            raise RuntimeError(f"conversation {config.conversation_id!r} ended in {queue!r}, but its clean-up "
                               f"hook failed (retried every cycle): {ended.result.hook_error}")
        context.log.info(f"conversation {config.conversation_id!r} ended in {queue!r}: "
                         f"{ended.result.removed_total} message(s) dead-lettered; action {ended.action.action_id}")
        return _output(ended, removed=ended.result.removed_total)

    return run


def _edit(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: EditConfig) -> Output:
        result = edit(declaration, config.message_id, config.body_bytes(), config.headers, queue=queue,
                      source=config.source, edit_id=config.edit_id, actor=actor_of(context, config.actor),
                      run_id=context.run.run_id)
        context.log.info(f"edit {result.edit_id}: message {result.message_id!r} sent back to {queue}/inbound "
                         f"(moved {result.moved}{', completed earlier' if result.already_done else ''})")
        return _output(result, moved=result.moved)

    return run


def _purge(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: PurgeConfig) -> Output:
        # Derived from the run: re-executing a failed purge run completes that purge.
        request = PurgeRequest.model_validate(config.model_dump(exclude={"actor"}) | {
            "queue": queue, "id": config.id or f"purge-{root_run_id(context)}"})
        result = purge(declaration, request, ActionContext(actor=actor_of(context, config.actor),
                                                           run_id=context.run.run_id))
        context.log.info(format_purge(result) + ("" if config.confirm else "\n  set confirm: true to delete them"))
        return _output(result, purged=result.purged if config.confirm else 0, would_purge=result.purged)

    return run


def _undo(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: UndoConfig) -> Output:
        if find_action(QueueTables.of(declaration, queue), config.action_id) is None:
            elsewhere = find_recorded(declaration, config.action_id)
            where = f"; it is queue {elsewhere.queue!r}'s: run {operator_job_name(elsewhere.queue, 'undo')}" \
                if elsewhere is not None else " (see `poison-pipeline actions`)"
            raise UndoError(f"action_id {config.action_id!r}: no such action in queue {queue!r}{where}")
        result = undo(declaration, config.action_id, actor_of(context, config.actor), run_id=context.run.run_id)
        context.log.info(f"undo {result.undo_id} ({result.how}): {result.restored} restored; "
                         f"unrecoverable: {', '.join(result.unrecoverable) or 'none'}")
        if result.unrecoverable:
            raise UndoError(f"undo {result.undo_id}: {len(result.unrecoverable)} message(s) moved on since and "
                            f"could not come back: {', '.join(result.unrecoverable)}")
        return _output(result, restored=result.restored)

    return run


_ACTIONS: dict[str, tuple[Callable[[Declaration, str], Callable[..., Output]], type[Config], str]] = {
    "enable": (_enable, EnableConfig, "Enables the queue, resuming its cycles."),
    "end_conversation": (_end_conversation, EndConversationConfig,
                         "Ends a conversation with an error, dead-lettering its waiting messages."),
    "edit": (_edit, EditConfig, "Replaces a failed message's body and headers and sends it back to the inbound."),
    "purge": (_purge, PurgeConfig, "Deletes failed messages older than an age for good (with confirm: true)."),
    "undo": (_undo, UndoConfig, "Reverses a redrive, an edit or a purge of the queue."),
}


def _operator_job(declaration: Declaration, queue: str, action: str) -> JobDefinition:
    factory, config_class, description = _ACTIONS[action]
    body = factory(declaration, queue)

    def compute(context: OpExecutionContext, config: Config) -> Output:
        return body(context, config)

    # The config parameter's annotation is what Dagster turns into the Launchpad's schema.
    compute.__annotations__ = {"context": OpExecutionContext, "config": config_class, "return": Output}
    step = op(name=operator_op_name(queue, action), out=Out(Nothing), description=description)(compute)

    @job(name=operator_job_name(queue, action), tags={QUEUE_TAG: queue}, executor_def=in_process_executor,
         description=f"{description} Queue {queue}.")
    def operator_job() -> None:
        step()

    return operator_job


def operator_jobs(declaration: Declaration, queue: str) -> list[JobDefinition]:
    return [_operator_job(declaration, queue, action) for action in _ACTIONS]
