"""What waits in Dagster's run queue: a sensor requests no second run while one waits to start,
and a staying run gives the queue's slot up once other work of its queue waits for it."""

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from poison_pipeline.defs.naming import QUEUE_TAG

_NOT_STARTED = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING]


def run_waiting(instance: DagsterInstance, job: str) -> bool:
    """Whether a run of `job` is queued or starting: it takes what is due once it starts."""
    return bool(instance.get_run_ids(RunsFilter(job_name=job, statuses=_NOT_STARTED), limit=1))


def other_work_waiting(instance: DagsterInstance, queue: str, job: str) -> bool:
    """Whether a run of another job of `queue` (a retry cycle, an operator's action) waits to start:
    one run per queue runs at a time, so it waits for the current one to end."""
    runs = instance.get_runs(RunsFilter(tags={QUEUE_TAG: queue}, statuses=_NOT_STARTED))
    return any(run.job_name != job for run in runs)
