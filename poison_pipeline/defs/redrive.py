"""The redrive assets of a queue, two ways of choosing what goes back into its inbound (in one run,
by operations/redrive.py, the code the CLI runs):

- `redrive`, partitioned by the day messages failed: a range of days answers "what failed while
  that deploy was out", whatever the cause;
- `redrive_group`, partitioned by failure group (dynamic partitions that `<queue>__failure_groups_sensor`
  keeps to the groups the failure tables hold): a group answers "this cause is fixed", across
  midnight and across poison, dead_letter and quarantine, one run (and one undo id) per group.
"""

import functools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dagster import (
    AddDynamicPartitionsRequest,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    DailyPartitionsDefinition,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)
from pydantic import Field

from poison_pipeline.defs.failure_metadata import failure_versions, materialize_changed
from poison_pipeline.defs.naming import (
    ACTOR_TAG,
    DRY_RUN_TAG,
    QUEUE_TAG,
    asset_key,
    failure_groups_partitions_name,
    failure_groups_sensor_name,
    redrive_asset_key,
    redrive_group_asset_key,
    redrive_group_job_name,
    redrive_job_name,
)
from poison_pipeline.defs.run_config import ACTOR_HELP, actor_of, run_request
from poison_pipeline.defs.sensors import parse_cursor
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, INBOUND, POISON, QUARANTINE
from poison_pipeline.operations.groups import UnknownGroup, failure_groups, locate_group
from poison_pipeline.operations.ramp import RampResult
from poison_pipeline.operations.redrive import SAMPLE, RedriveOptions, RedriveRequest, RedriveResult, redrive
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.storage.faults import redacted_failures
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.text.redrive import format_ramp

if TYPE_CHECKING:
    from poison_pipeline.runs.dagster_types import UnresolvedAssetJobDefinition

# The first day a user can pick. Failures are kept until purged, so the partitions reach back well
# before any lake this version wrote; a day without failures redrives nothing. Today is a partition
# too (end_offset=1): an operator redrives this morning's failures this afternoon.
REDRIVE_START = "2024-01-01"
REDRIVE_PARTITIONS = DailyPartitionsDefinition(start_date=REDRIVE_START, end_offset=1)


class SourceTable(StrEnum):
    """A failure table, as the launchpad offers it: a name it does not list is refused there."""

    poison = POISON
    dead_letter = DEAD_LETTER
    quarantine = QUARANTINE


class RedriveConfig(Config, RedriveOptions):
    """What `poison-pipeline redrive` takes; the days come from the partitions materialized (and the
    failed_after and failed_before given narrow them)."""

    # Narrower than the request's list of names: the launchpad checks each against the enum.
    source_tables: list[SourceTable] = Field(  # type: ignore[assignment]
        default_factory=lambda: list(SourceTable), description=RedriveOptions.model_fields["source_tables"].description)
    actor: str | None = Field(default=None, description=ACTOR_HELP)


def _metadata(request: RedriveRequest, scope: dict[str, str], results: list[RedriveResult],
              ramp: RampResult | None) -> dict[str, Any]:
    by_group: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    for result in results:
        by_group.update(result.by_group)
        by_type.update(result.by_message_type)
    total = lambda name: sum(getattr(r, name) for r in results)  # noqa: E731
    # A dry run moves nothing: it says what would move, under its own name.
    moved = "would_move" if request.dry_run else "moved"
    return {
        "dry_run": MetadataValue.bool(request.dry_run),
        "target": MetadataValue.text(f"{request.to or request.queue}/{INBOUND}"),
        # What was chosen: the failure days (failed_from, failed_before) or the group.
        **{name: MetadataValue.text(value) for name, value in scope.items()},
        "selected": MetadataValue.int(total("selected")),
        moved: MetadataValue.int(total("moved")),
        "skipped_processed": MetadataValue.int(total("skipped_processed")),
        "skipped_loop_guard": MetadataValue.int(total("skipped_loop_guard")),
        "skipped_limit": MetadataValue.int(total("skipped_limit")),
        "by_group": MetadataValue.json(dict(by_group.most_common())),
        "by_message_type": MetadataValue.json(dict(by_type.most_common())),
        "sample_ids": MetadataValue.json([i for r in results for i in r.sample_ids][:SAMPLE]),
        "by_source": MetadataValue.json({r.source: {moved: r.moved, "selected": r.selected} for r in results}),
        # The version of each source table the selection read: what `groups` showed, or the cut-off given.
        "source_versions": MetadataValue.json({r.source: r.source_version for r in results}),
        # Action ids for `undo` (nothing is recorded for a dry run or a table with nothing to move).
        "redrive_ids": MetadataValue.json([r.action_id for r in results if r.action_id]),
        **({} if ramp is None else {"ramp": MetadataValue.json(asdict(ramp))}),
        # A dry run with a ramp: how many each step would send.
        **({"ramp_steps": MetadataValue.json(results[0].ramp_steps)} if results and results[0].ramp_steps else {}),
    }


def _redrive_asset_args(declaration: Declaration, queue: str) -> dict[str, Any]:
    """What both redrive assets of a queue share."""
    return {
        # Downstream of the failure tables only: the inbound it writes to is upstream of them, and
        # lineage must stay acyclic. The metadata says where the messages go.
        "deps": [asset_key(queue, t) for t in FAILURE_TABLES],
        "group_name": queue,
        "kinds": {"delta"},
        "metadata": {"redrives_into": f"{queue}/{INBOUND}",
                     "redrives_into_uri": QueueTables.of(declaration, queue).uri(INBOUND)},
        # A dry run (or a group whose messages all left) materializes nothing.
        "output_required": False,
    }


def redrive_asset(declaration: Declaration, queue: str) -> AssetsDefinition:
    @asset(
        key=redrive_asset_key(queue),
        partitions_def=REDRIVE_PARTITIONS,
        backfill_policy=BackfillPolicy.single_run(),
        description=f"Sends the messages that failed on the chosen days back into {queue}/{INBOUND}.",
        **_redrive_asset_args(declaration, queue),
    )
    def redrive_failures(context: AssetExecutionContext, config: RedriveConfig) -> Iterator[MaterializeResult]:
        window = context.partition_time_window
        request = _request(context, queue, config, {})
        yield from _redrive(context, declaration, request.within(window.start, window.end), config, {
            "failed_from": window.start.isoformat(), "failed_before": window.end.isoformat()})

    return redrive_failures


def _request(context: AssetExecutionContext, queue: str, config: RedriveConfig,
             chosen: dict[str, Any]) -> RedriveRequest:
    fields = config.model_dump(exclude={"actor"}) | {"source_tables": [str(t) for t in config.source_tables]}
    # One redrive per run chain: a re-execution resumes it, a new run starts another.
    return run_request(RedriveRequest, fields | chosen | {"queue": queue}, context.op_execution_context, "redrive")


def _redrive(context: AssetExecutionContext, declaration: Declaration, request: RedriveRequest,
             config: RedriveConfig, scope: dict[str, str]) -> Iterator[MaterializeResult]:
    """Run `request` for the asset being materialized: tags, progress, materializations of the failure
    tables it changed, and its metadata (a dry run observes the asset and marks nothing)."""
    queue = request.queue
    actor = actor_of(context.op_execution_context, config.actor)
    # The runs list tells a preview from a redrive, and who ran it.
    context.instance.add_run_tags(context.run.run_id, {DRY_RUN_TAG: str(request.dry_run).lower(), ACTOR_TAG: actor})
    with redacted_failures():  # Dagster logs an error with its causes: no credentials in them
        before = failure_versions(declaration, queue)
        report = redrive(declaration, request, ActionContext(
            actor=actor, run_id=context.run.run_id, progress=functools.partial(_log_progress, context, queue)))
        for materialization in materialize_changed(declaration, queue, before):
            context.log_event(materialization)
    for result in report.results:
        context.log.info(f"{queue}/{result.source} -> {result.target}/{INBOUND}: moved {result.moved} of "
                         f"{result.selected} selected ({result.redrive_id}"
                         f"{', completed earlier' if result.already_done else ''})")
    if report.ramp is not None:
        context.log.info(format_ramp(report.ramp))
    metadata = _metadata(request, scope, report.results, report.ramp)
    if request.dry_run:  # moved nothing: observed, so no partition is marked redriven
        partition = context.partition_key if context.has_partition_key else None
        context.log_event(AssetObservation(context.asset_key, partition=partition, metadata=metadata))
        return
    yield MaterializeResult(metadata=metadata)


def failure_group_partitions(queue: str) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name=failure_groups_partitions_name(queue))


def redrive_group_asset(declaration: Declaration, queue: str) -> AssetsDefinition:
    @asset(
        key=redrive_group_asset_key(queue),
        partitions_def=failure_group_partitions(queue),
        # One run per group: each is a redrive of its own, with its own id for `undo`.
        backfill_policy=BackfillPolicy.multi_run(1),
        description=f"Sends the messages of the chosen failure group back into {queue}/{INBOUND}.",
        **_redrive_asset_args(declaration, queue),
    )
    def redrive_group(context: AssetExecutionContext, config: RedriveConfig) -> Iterator[MaterializeResult]:
        group = context.partition_key
        if config.group not in (None, group):
            raise Failure(f"group {config.group!r} in the config, but the partition chosen is group {group!r}: "
                          "the partition is the group, leave `group` out of the config")
        request = _request(context, queue, config, {"group": group})
        try:
            locate_group(declaration, group, queue)
        except UnknownGroup as gone:
            # Its messages left since the partitions were listed: nothing to send, nothing marked.
            context.log.warning(f"{gone}: nothing to redrive")
            return
        yield from _redrive(context, declaration, request, config, {"group": group})

    return redrive_group


def redrive_group_job(queue: str) -> "UnresolvedAssetJobDefinition":
    """The group redrive asset as a job of its own, so its runs carry the queue tag."""
    return _queue_job(queue, redrive_group_job_name(queue), redrive_group_asset_key(queue),
                      f"Redrives the chosen failure groups back into {queue}/{INBOUND}, a run per group.")


def failure_groups_sensor(declaration: Declaration, queue: str) -> SensorDefinition:
    """Keeps the partitions of `redrive_group` to the failure groups the queue's failure tables hold:
    a group that appears is added, a group whose messages all left is removed. Its cursor is the
    failure tables' versions: while none moved, an evaluation reads their logs only."""
    name = failure_groups_partitions_name(queue)

    @sensor(name=failure_groups_sensor_name(queue), minimum_interval_seconds=15,
            default_status=DefaultSensorStatus.RUNNING,
            description=f"Lists the failure groups of {queue} as the partitions of its redrive_group asset.")
    def evaluate(context: SensorEvaluationContext) -> SensorResult:
        versions = failure_versions(declaration, queue)
        cursor = json.dumps(versions, sort_keys=True)
        if parse_cursor(context.cursor) == versions:
            return SensorResult(skip_reason=SkipReason(f"no failure table of {queue} changed"), cursor=cursor)
        held = {g.id for g in failure_groups(declaration, queue)}
        listed = set(context.instance.get_dynamic_partitions(name))
        requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = []
        if added := sorted(held - listed):
            requests.append(AddDynamicPartitionsRequest(name, added))
        if gone := sorted(listed - held):
            requests.append(DeleteDynamicPartitionsRequest(name, gone))
        if not requests:
            return SensorResult(skip_reason=SkipReason(f"the {len(held)} failure group(s) of {queue} are listed"),
                                cursor=cursor)
        return SensorResult(dynamic_partitions_requests=requests, cursor=cursor)

    return evaluate


def redrive_job(queue: str) -> "UnresolvedAssetJobDefinition":
    """The redrive asset as a job of its own, so runs and backfills launched from it carry the queue tag."""
    return _queue_job(queue, redrive_job_name(queue), redrive_asset_key(queue),
                      f"Redrives the failures of the chosen days back into {queue}/{INBOUND}.")


def _queue_job(queue: str, name: str, key: AssetKey, description: str) -> "UnresolvedAssetJobDefinition":
    return define_asset_job(name=name, selection=[key], executor_def=in_process_executor, tags={QUEUE_TAG: queue},
                            description=description)


def _log_progress(context: AssetExecutionContext, moving: str, moved: int, total: int) -> None:
    context.log.debug(f"{moving}: {moved} of {total}")
