"""Operator actions as jobs with typed run config (the Launchpad): enable, end-conversation, edit,
purge, archive, restore and undo of one queue, each calling the function the CLI calls and recorded in the queue's
actions ledger with the actor and the run id; and simulate, which changes nothing and records its
report as the metadata of the queue's `policy_simulation` asset. One job per queue and action, so
every run carries the queue's tag (dagster.yaml: one run per queue at a time)."""

import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetMaterialization,
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
from pydantic import Field

from poison_pipeline.defs.failure_metadata import failure_versions, materialize_changed
from poison_pipeline.defs.naming import (
    ACTOR_TAG,
    DRY_RUN_TAG,
    QUEUE_TAG,
    operator_job_name,
    operator_op_name,
    simulation_asset_key,
)
from poison_pipeline.defs.run_config import ACTOR_HELP, actor_of, run_request
from poison_pipeline.domain.declaration import Declaration, policy_of_yaml
from poison_pipeline.domain.durations import parse_duration
from poison_pipeline.operations.archive import (
    ARCHIVE,
    RESTORE,
    ArchiveOptions,
    ArchiveRequest,
    ArchiveResult,
    RestoreOptions,
    RestoreRequest,
    archive,
    restore,
)
from poison_pipeline.operations.edit import EditOptions, EditRequest, edit
from poison_pipeline.operations.enable import EnableOptions, EnableRequest, enable
from poison_pipeline.operations.end_conversation import EndConversationOptions, EndConversationRequest, end_conversation
from poison_pipeline.operations.purge import PurgeOptions, PurgeRequest, purge
from poison_pipeline.operations.requests import ActionContext, Request
from poison_pipeline.operations.simulate import simulate
from poison_pipeline.operations.undo import UndoError, UndoOptions, UndoRequest, find_recorded, undo
from poison_pipeline.storage.faults import redacted_failures
from poison_pipeline.text.archive import format_archive
from poison_pipeline.text.purge import format_purge
from poison_pipeline.text.simulation import simulation_markdown


class OperatorConfig(Config):
    """An operator job's config: its action's options, who acts, and whether the run only previews."""

    actor: str | None = Field(default=None, description=ACTOR_HELP)

    def previews(self) -> bool | None:
        """Whether the run changes nothing (the runs list tells previews from actions); None: the
        action has no preview."""
        return None


class EnableConfig(OperatorConfig, EnableOptions):
    pass


class EndConversationConfig(OperatorConfig, EndConversationOptions):
    pass


class EditConfig(OperatorConfig, EditOptions):
    pass


class PurgeConfig(OperatorConfig, PurgeOptions):
    def previews(self) -> bool | None:
        return not self.confirm


class ArchiveConfig(OperatorConfig, ArchiveOptions):
    def previews(self) -> bool | None:
        return self.dry_run


class RestoreConfig(OperatorConfig, RestoreOptions):
    def previews(self) -> bool | None:
        return self.dry_run


class UndoConfig(OperatorConfig, UndoOptions):
    pass


class SimulateConfig(OperatorConfig):
    policy_yaml: str = Field(description="The candidate policy as YAML: the fields of a queue's `policy:` section.")
    since: str | None = Field(default=None, description="Only journeys whose first attempt is this recent "
                                                         "(90, 30m, 7d); default: every recorded attempt.")

    def previews(self) -> bool | None:
        return True  # a simulation changes nothing


def _fields(config: OperatorConfig, **values: Any) -> dict[str, Any]:
    """The action's request's fields from a job's run config (what the config leaves out, the job says)."""
    return config.model_dump(exclude={"actor"}) | values


def _request(model: type[Request], config: OperatorConfig, **values: Any) -> Any:
    return model.model_validate(_fields(config, **values))


def _context(context: OpExecutionContext, config: OperatorConfig) -> ActionContext:
    return ActionContext(actor=actor_of(context, config.actor), run_id=context.run.run_id)


def _run_tags(context: OpExecutionContext, config: OperatorConfig) -> dict[str, str]:
    """Who acts, and whether the run only previews (a dry run, a purge not confirmed, a simulation):
    the runs list tells them apart."""
    tags = {ACTOR_TAG: _context(context, config).actor}
    if (previews := config.previews()) is not None:
        tags[DRY_RUN_TAG] = str(previews).lower()
    return tags


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)))


def _output(result: Any, **numbers: int) -> Output:
    metadata: dict[str, Any] = {name: MetadataValue.int(int(count)) for name, count in numbers.items()}
    metadata["result"] = MetadataValue.json(_jsonable(asdict(result)))
    return Output(None, metadata=metadata)


def _enable(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: EnableConfig) -> Output:
        result = enable(declaration, _request(EnableRequest, config, queue=queue), _context(context, config))
        context.log.info(f"queue {queue!r} enabled ({'it was disabled' if result.changed else 'it was enabled'}); "
                         f"action {result.action.action_id}")
        return _output(result, changed=result.changed)

    return run


def _end_conversation(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: EndConversationConfig) -> Output:
        [ended] = end_conversation(declaration, _request(EndConversationRequest, config, queue=queue),
                                   _context(context, config))
        if ended.result.hook_error:
            raise RuntimeError(f"conversation {config.conversation_id!r} ended in {queue!r}, but its clean-up "
                               f"hook failed (retried every cycle): {ended.result.hook_error}")
        context.log.info(f"conversation {config.conversation_id!r} ended in {queue!r}: "
                         f"{ended.result.removed_total} message(s) dead-lettered; action {ended.action.action_id}")
        return _output(ended, removed=ended.result.removed_total)

    return run


def _edit(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: EditConfig) -> Output:
        result = edit(declaration, _request(EditRequest, config, queue=queue), _context(context, config))
        context.log.info(f"edit {result.edit_id}: message {result.message_id!r} sent back to {queue}/inbound "
                         f"(moved {result.moved}{', completed earlier' if result.already_done else ''})")
        return _output(result, moved=result.moved)

    return run


def _purge(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: PurgeConfig) -> Output:
        # Derived from the run: re-executing a failed purge run completes that purge.
        request = run_request(PurgeRequest, _fields(config, queue=queue), context, "purge")
        result = purge(declaration, request, _context(context, config))
        context.log.info(format_purge(result) + ("" if config.confirm else "\n  set confirm: true to delete them"))
        return _output(result, purged=result.purged if config.confirm else 0, would_purge=result.purged)

    return run


def _archive(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: ArchiveConfig) -> Output:
        # Derived from the run: re-executing a failed run completes that archive.
        request = run_request(ArchiveRequest, _fields(config, queue=queue), context, ARCHIVE)
        return _archived(context, archive(declaration, request, _context(context, config)))

    return run


def _restore(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: RestoreConfig) -> Output:
        request = run_request(RestoreRequest, _fields(config, queue=queue), context, RESTORE)
        return _archived(context, restore(declaration, request, _context(context, config)))

    return run


def _archived(context: OpExecutionContext, result: ArchiveResult) -> Output:
    context.log.info(format_archive(result))
    return _output(result, **{result.kind + "d": 0 if result.dry_run else result.count})


def _undo(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: UndoConfig) -> Output:
        try:
            result = undo(declaration, _request(UndoRequest, config, queue=queue), _context(context, config))
        except UndoError as error:
            elsewhere = find_recorded(declaration, config.action_id)
            if elsewhere is None or elsewhere.queue == queue:
                raise
            raise UndoError(f"{error}: run {operator_job_name(elsewhere.queue, 'undo')}") from None
        context.log.info(f"undo {result.undo_id} ({result.how}): {result.restored} restored; "
                         f"unrecoverable: {', '.join(result.unrecoverable) or 'none'}")
        if result.unrecoverable:
            raise UndoError(f"undo {result.undo_id}: {len(result.unrecoverable)} message(s) moved on since and "
                            f"could not come back: {', '.join(result.unrecoverable)}")
        return _output(result, restored=result.restored)

    return run


def _simulate(declaration: Declaration, queue: str) -> Callable[..., Output]:
    def run(context: OpExecutionContext, config: SimulateConfig) -> Output:
        policy = policy_of_yaml(config.policy_yaml, "policy_yaml")
        since = None if config.since is None else datetime.now(UTC) - parse_duration(config.since)
        found = simulate(declaration, queue, policy, since=since)
        report = simulation_markdown(found)
        context.log_event(AssetMaterialization(simulation_asset_key(queue), description="policy simulation", metadata={
            "report": MetadataValue.md(report), "messages": MetadataValue.int(found.messages),
            "changed": MetadataValue.int(found.changed), "simulated": MetadataValue.json(found.simulated),
            "recorded": MetadataValue.json(found.recorded)}))
        context.log.info(report)
        return _output(found, messages=found.messages, changed=found.changed)

    return run


_ACTIONS: dict[str, tuple[Callable[[Declaration, str], Callable[..., Output]], type[OperatorConfig], str]] = {
    "enable": (_enable, EnableConfig, "Enables the queue, resuming its cycles."),
    "end_conversation": (_end_conversation, EndConversationConfig,
                         "Ends a conversation with an error, dead-lettering its waiting messages."),
    "edit": (_edit, EditConfig, "Replaces a failed message's body and headers and sends it back to the inbound."),
    "purge": (_purge, PurgeConfig, "Deletes failed messages older than an age for good (with confirm: true)."),
    "archive": (_archive, ArchiveConfig, "Archives failed messages: left out of groups, checks and "
                "alerts, kept readable, reversible."),
    "restore": (_restore, RestoreConfig, "Restores archived messages: failures like any other again."),
    "undo": (_undo, UndoConfig, "Reverses a redrive, an edit, a purge, an archive or a restore of the queue."),
    "simulate": (_simulate, SimulateConfig, "Replays the recorded attempts under a candidate policy; changes nothing."),
}


def _operator_job(declaration: Declaration, queue: str, action: str) -> JobDefinition:
    factory, config_class, description = _ACTIONS[action]
    body = factory(declaration, queue)

    def compute(context: OpExecutionContext, config: OperatorConfig) -> Output:
        with redacted_failures():  # Dagster logs an error with its causes: no credentials in them
            context.instance.add_run_tags(context.run.run_id, _run_tags(context, config))
            before = failure_versions(declaration, queue)
            output = body(context, config)
            for materialization in materialize_changed(declaration, queue, before):
                context.log_event(materialization)
            return output

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
