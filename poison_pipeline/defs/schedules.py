"""The daily schedules of a queue: retention purges what failed longer ago than the queue's declared
`retention` (operations/archive.apply_retention), defined only for a queue that declares one;
maintenance compacts, checkpoints and vacuums its tables (operations/maintenance.maintain)."""

from dagster import (
    DefaultScheduleStatus,
    JobDefinition,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    ScheduleDefinition,
    in_process_executor,
    job,
    op,
)

from poison_pipeline.defs.naming import (
    QUEUE_TAG,
    maintenance_job_name,
    maintenance_schedule_name,
    retention_job_name,
    retention_schedule_name,
)
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations.archive import apply_retention
from poison_pipeline.operations.maintenance import maintain
from poison_pipeline.text.maintenance import format_maintained
from poison_pipeline.text.purge import format_purge

# Early in the morning (UTC), away from the business day's traffic.
RETENTION_CRON = "15 3 * * *"
# After retention, so that the files it leaves are compacted the same night.
MAINTENANCE_CRON = "45 3 * * *"


def retention_job(declaration: Declaration, queue: str) -> JobDefinition:
    @op(name=f"{retention_job_name(queue)}_op", out=Out(Nothing),
        description="Purges the failed messages older than the queue's declared retention.")
    def apply(context: OpExecutionContext) -> Output:
        results = apply_retention(declaration, queue, run_id=context.run.run_id)
        for result in results:
            context.log.info(format_purge(result))
        return Output(None, metadata={f"purged_{r.table}": MetadataValue.int(r.purged) for r in results})

    @job(name=retention_job_name(queue), tags={QUEUE_TAG: queue}, executor_def=in_process_executor,
         description=f"Applies {queue}'s declared retention: purges failed messages kept long enough.")
    def retention() -> None:
        apply()

    return retention


def retention_schedules(declaration: Declaration, queue: str) -> list[ScheduleDefinition]:
    """The queue's daily retention schedule, stopped until an operator turns it on; none without a
    declared retention (its failures are kept until an operator purges them)."""
    if not declaration.queue(queue).retention:
        return []
    return [ScheduleDefinition(name=retention_schedule_name(queue), job=retention_job(declaration, queue),
                               cron_schedule=RETENTION_CRON, execution_timezone="UTC",
                               default_status=DefaultScheduleStatus.STOPPED,
                               description=f"Daily: purges {queue}'s failures older than its declared retention.")]


def maintenance_job(declaration: Declaration, queue: str) -> JobDefinition:
    @op(name=f"{maintenance_job_name(queue)}_op", out=Out(Nothing),
        description="Compacts, checkpoints and vacuums the queue's tables under its lease.")
    def run_maintenance(context: OpExecutionContext) -> Output:
        result = maintain(declaration, queue, run_id=context.run.run_id)
        context.log.info(format_maintained(result))
        return Output(None, metadata={
            f"files_{t.table}": MetadataValue.text(f"{t.files_before} -> {t.files_after}") for t in result.tables})

    @job(name=maintenance_job_name(queue), tags={QUEUE_TAG: queue}, executor_def=in_process_executor,
         description=f"Compacts {queue}'s small files, checkpoints its logs and vacuums old files.")
    def maintenance() -> None:
        run_maintenance()

    return maintenance


def maintenance_schedules(declaration: Declaration, queue: str) -> list[ScheduleDefinition]:
    """The queue's daily maintenance, stopped until an operator turns it on: its vacuum deletes for
    good the files of versions older than 7 days, which `inspect --as-of` reads."""
    return [ScheduleDefinition(name=maintenance_schedule_name(queue), job=maintenance_job(declaration, queue),
                               cron_schedule=MAINTENANCE_CRON, execution_timezone="UTC",
                               default_status=DefaultScheduleStatus.STOPPED,
                               description=f"Daily: compacts, checkpoints and vacuums {queue}'s tables.")]
