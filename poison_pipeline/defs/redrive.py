"""The redrive asset of a queue: partitioned by the day messages failed, materializing a range of
days sends that range's failures back into the queue's inbound in one run (operations/redrive.py,
the code the CLI runs)."""

import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    define_asset_job,
    in_process_executor,
)
from pydantic import Field

from poison_pipeline.defs.failure_metadata import failure_versions, observe_changed
from poison_pipeline.defs.naming import (
    ACTOR_TAG,
    DRY_RUN_TAG,
    QUEUE_TAG,
    asset_key,
    redrive_asset_key,
    redrive_job_name,
)
from poison_pipeline.defs.run_config import ACTOR_HELP, actor_of, root_run_id
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, INBOUND, POISON, QUARANTINE
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


def redrive_id(root: str) -> str:
    """One redrive per run chain: a re-execution resumes it, a new run starts another."""
    return f"redrive-{root}"


def _metadata(request: RedriveRequest, start: datetime, end: datetime, results: list[RedriveResult],
              ramp: RampResult | None
              ) -> dict[str, Any]:
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
        "failed_from": MetadataValue.text(start.isoformat()),
        "failed_before": MetadataValue.text(end.isoformat()),
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


def redrive_asset(declaration: Declaration, queue: str) -> AssetsDefinition:
    tables = QueueTables.of(declaration, queue)

    @asset(
        key=redrive_asset_key(queue),
        # Downstream of the failure tables only: the inbound it writes to is upstream of them, and
        # lineage must stay acyclic. The metadata says where the messages go.
        deps=[asset_key(queue, t) for t in FAILURE_TABLES],
        group_name=queue,
        kinds={"delta"},
        partitions_def=REDRIVE_PARTITIONS,
        backfill_policy=BackfillPolicy.single_run(),
        description=f"Sends the messages that failed on the chosen days back into {queue}/{INBOUND}.",
        metadata={"redrives_into": f"{queue}/{INBOUND}", "redrives_into_uri": tables.uri(INBOUND)},
        output_required=False,  # a dry run materializes nothing
    )
    def redrive_failures(context: AssetExecutionContext, config: RedriveConfig) -> Iterator[MaterializeResult]:
        window = context.partition_time_window
        start, end = window.start, window.end
        fields = config.model_dump(exclude={"actor"}) | {"source_tables": [str(t) for t in config.source_tables]}
        request = RedriveRequest.model_validate(
            fields | {"queue": queue, "id": config.id or redrive_id(root_run_id(context.op_execution_context))})
        actor = actor_of(context.op_execution_context, config.actor)
        # The runs list tells a preview from a redrive, and who ran it.
        context.instance.add_run_tags(context.run.run_id, {DRY_RUN_TAG: str(request.dry_run).lower(),
                                                           ACTOR_TAG: actor})
        with redacted_failures():  # Dagster logs an error with its causes: no credentials in them
            before = failure_versions(declaration, queue)
            report = redrive(declaration, request.within(start, end), ActionContext(
                actor=actor, run_id=context.run.run_id, progress=functools.partial(_log_progress, context, queue)))
            for observation in observe_changed(declaration, queue, before):
                context.log_event(observation)
        for result in report.results:
            context.log.info(f"{queue}/{result.source} -> {result.target}/{INBOUND}: moved {result.moved} of "
                             f"{result.selected} selected ({result.redrive_id}"
                             f"{', completed earlier' if result.already_done else ''})")
        if report.ramp is not None:
            context.log.info(format_ramp(report.ramp))
        metadata = _metadata(request, start, end, report.results, report.ramp)
        if request.dry_run:  # moved nothing: observed, so no failure day is marked redriven
            context.log_event(AssetObservation(redrive_asset_key(queue), metadata=metadata))
            return
        yield MaterializeResult(metadata=metadata)

    return redrive_failures


def redrive_job(queue: str) -> "UnresolvedAssetJobDefinition":
    """The redrive asset as a job of its own, so runs and backfills launched from it carry the queue tag."""
    return define_asset_job(
        name=redrive_job_name(queue),
        selection=[redrive_asset_key(queue)],
        executor_def=in_process_executor,
        tags={QUEUE_TAG: queue},
        description=f"Redrives the failures of the chosen days back into {queue}/{INBOUND}.",
    )


def _log_progress(context: AssetExecutionContext, moving: str, moved: int, total: int) -> None:
    context.log.debug(f"{moving}: {moved} of {total}")
