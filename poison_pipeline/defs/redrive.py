"""The redrive asset of a queue: partitioned by the day messages failed, materializing a range of
days sends that range's failures back into the queue's inbound in one run (operations/redrive.py,
the code the CLI runs)."""

import functools
import math
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    define_asset_job,
    in_process_executor,
)
from pydantic import Field, field_validator

from poison_pipeline.defs.naming import QUEUE_TAG, asset_key, redrive_asset_key, redrive_job_name
from poison_pipeline.defs.run_config import SelectionConfig, actor_of, root_run_id
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import FAILURE_TABLES, INBOUND
from poison_pipeline.operations.actions import find_action
from poison_pipeline.operations.groups import UnknownGroup, locate_group
from poison_pipeline.operations.redrive import SAMPLE, RedriveResult, redrive
from poison_pipeline.operations.selection import SelectionError, selection_filter
from poison_pipeline.storage.tables import QueueTables

if TYPE_CHECKING:
    from poison_pipeline.runs.dagster_types import UnresolvedAssetJobDefinition

# The first day a user can pick. Failures are kept until purged, so the partitions reach back well
# before any lake this version wrote; a day without failures redrives nothing. Today is a partition
# too (end_offset=1): an operator redrives this morning's failures this afternoon.
REDRIVE_START = "2024-01-01"
REDRIVE_PARTITIONS = DailyPartitionsDefinition(start_date=REDRIVE_START, end_offset=1)


class RedriveConfig(SelectionConfig):
    """What `poison-pipeline redrive` takes; the days come from the partitions materialized."""

    source_tables: list[str] = Field(default=list(FAILURE_TABLES),
                                     description="Where the failed messages are taken from.")
    rate: float | None = Field(default=None, description="Messages per second released to the inbound "
                               "(shared by the source tables); null: all due now.")
    limit: int | None = Field(default=None, description="Move at most this many messages in all.")
    force: bool = Field(default=False, description="Send messages past the loop guard (max_redrives).")
    dry_run: bool = Field(default=False, description="Report what would move and change nothing.")
    actor: str | None = Field(default=None, description="Who redrives; default: the run's user tag.")

    @field_validator("source_tables")
    @classmethod
    def _failure_tables(cls, value: list[str]) -> list[str]:
        wrong = [t for t in value if t not in FAILURE_TABLES]
        if wrong or not value:
            raise ValueError(f"{value!r}: choose one or more of {', '.join(FAILURE_TABLES)}")
        if len(set(value)) != len(value):
            raise ValueError(f"{value!r}: a table is named twice")
        return value

    @field_validator("rate")
    @classmethod
    def _positive_rate(cls, value: float | None) -> float | None:
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{value!r}: give a positive number of messages per second")
        return value

    @field_validator("limit")
    @classmethod
    def _positive_limit(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{value!r}: give a positive number of messages")
        return value


def redrive_id(root: str, source: str) -> str:
    """One redrive per run chain and source table: a re-execution resumes it, a new run starts another."""
    return f"redrive-{root}-{source}"


def _sources(declaration: Declaration, queue: str, config: RedriveConfig) -> list[str]:
    """The source tables to take from: with a group, those that have rows of it."""
    if config.group is None:
        return list(config.source_tables)
    try:
        found = {g.table for g in locate_group(declaration, config.group, queue)}
    except UnknownGroup as error:
        raise SelectionError(f"group: {error}") from None
    sources = [t for t in config.source_tables if t in found]
    if not sources:
        raise SelectionError(f"group {config.group!r}: its rows are in {', '.join(sorted(found))} of queue "
                             f"{queue!r}, none in source_tables {config.source_tables}")
    return sources


def _recorded(declaration: Declaration, queue: str, result: RedriveResult) -> RedriveResult:
    """An already completed redrive's counts, from its action (a re-execution after it was done)."""
    if not result.already_done:
        return result
    action = find_action(QueueTables.of(declaration, queue), result.redrive_id)
    counts = action.counts if action is not None else {}
    return RedriveResult(result.redrive_id, result.queue, result.source, result.target, False,
                         selected=counts.get("selected", 0), moved=counts.get("moved", 0),
                         skipped_processed=counts.get("skipped_processed", 0),
                         skipped_loop_guard=counts.get("skipped_loop_guard", 0),
                         skipped_limit=counts.get("skipped_limit", 0), already_done=True,
                         action_id=result.action_id)


def _metadata(queue: str, start: datetime, end: datetime, dry_run: bool,
              results: list[RedriveResult]) -> dict[str, Any]:
    by_group: Counter[str] = Counter()
    by_type: Counter[str] = Counter()
    for result in results:
        by_group.update(result.by_group)
        by_type.update(result.by_message_type)
    total = lambda name: sum(getattr(r, name) for r in results)  # noqa: E731
    return {
        "dry_run": MetadataValue.bool(dry_run),
        "target": MetadataValue.text(f"{queue}/{INBOUND}"),
        "failed_from": MetadataValue.text(start.isoformat()),
        "failed_before": MetadataValue.text(end.isoformat()),
        "selected": MetadataValue.int(total("selected")),
        # For a dry run, what would move.
        "moved": MetadataValue.int(total("moved")),
        "skipped_processed": MetadataValue.int(total("skipped_processed")),
        "skipped_loop_guard": MetadataValue.int(total("skipped_loop_guard")),
        "skipped_limit": MetadataValue.int(total("skipped_limit")),
        "by_group": MetadataValue.json(dict(by_group.most_common())),
        "by_message_type": MetadataValue.json(dict(by_type.most_common())),
        "sample_ids": MetadataValue.json([i for r in results for i in r.sample_ids][:SAMPLE]),
        "by_source": MetadataValue.json({r.source: {"moved": r.moved, "selected": r.selected} for r in results}),
        # Action ids for `undo` (nothing is recorded for a dry run or a table with nothing to move).
        "redrive_ids": MetadataValue.json([r.action_id for r in results if r.action_id]),
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
    )
    def redrive_failures(context: AssetExecutionContext, config: RedriveConfig) -> MaterializeResult:
        window = context.partition_time_window
        start, end = window.start, window.end
        actor = actor_of(context.op_execution_context, config.actor)
        root = root_run_id(context.op_execution_context)
        selection = config.selection(failed_after=start, failed_before=end)
        sources = _sources(declaration, queue, config)
        # Every source is checked before anything is written (`where` parsed too), so a bad filter changes
        # nothing; a dry run, or a rate shared by the tables that have something to move, plans each.
        for source in sources:
            selection_filter(selection, source)
        rate = config.rate
        if config.dry_run or rate is not None:
            previews = [redrive(declaration, queue, s, selection, dry_run=True, limit=config.limit,
                                force=config.force, redrive_id=redrive_id(root, s)) for s in sources]
            if config.dry_run:
                return MaterializeResult(metadata=_metadata(queue, start, end, True, previews))
            if rate is not None:
                rate /= max(1, sum(1 for p in previews if p.moved))
        results: list[RedriveResult] = []
        remaining = config.limit
        for source in sources:
            if remaining == 0:
                break
            result = _recorded(declaration, queue, redrive(
                declaration, queue, source, selection, rate=rate, limit=remaining, force=config.force,
                redrive_id=redrive_id(root, source), actor=actor, run_id=context.run.run_id,
                progress=functools.partial(_log_progress, context, f"{queue}/{source}")))
            context.log.info(f"{queue}/{source} -> {queue}/{INBOUND}: moved {result.moved} of {result.selected} "
                             f"selected ({result.redrive_id}{', completed earlier' if result.already_done else ''})")
            results.append(result)
            remaining = None if remaining is None else remaining - result.moved
        return MaterializeResult(metadata=_metadata(queue, start, end, False, results))

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
