"""Dagster Definitions generated from a declaration."""

from __future__ import annotations

from typing import Any

from dagster import Definitions, in_process_executor

from poison_pipeline.defs.alerts import (
    action_left_job,
    action_left_sensor,
    messages_failed_job,
    messages_failed_sensor,
    queue_disabled_job,
    queue_disabled_sensor,
    queue_recovered_job,
    queue_recovered_sensor,
    user_code_broken_job,
    user_code_broken_sensor,
)
from poison_pipeline.defs.assets import queue_assets
from poison_pipeline.defs.checks import check_keys, queue_checks
from poison_pipeline.defs.jobs import cycle_job
from poison_pipeline.defs.operator_jobs import operator_jobs
from poison_pipeline.defs.redrive import (
    failure_groups_sensor,
    redrive_asset,
    redrive_group_asset,
    redrive_group_job,
    redrive_job,
)
from poison_pipeline.defs.resources import SparkResource
from poison_pipeline.defs.schedules import maintenance_schedules, retention_schedules
from poison_pipeline.defs.sensors import transmission_sensor, waiting_sensor
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.policy import OutageRecovery
from poison_pipeline.storage.tables import TRANSMISSION, QueueTables
from poison_pipeline.views.user_code import code_problems


def build_definitions(declaration: Declaration) -> Definitions:
    """Every queue's definitions. A queue whose code does not import is kept: its sensors skip,
    saying why, and its user_code check fails; the other queues run as declared."""
    assets: list[Any] = []
    checks: list[Any] = []
    jobs: list[Any] = []
    sensors: list[Any] = []
    schedules: list[Any] = []
    broken = code_problems(declaration)
    for queue in declaration.queues:
        assets.extend(queue_assets(declaration, queue))
        checks.append(queue_checks(declaration, queue))
        after_cycle = check_keys(declaration, queue)
        for table in QueueTables.of(declaration, queue).waiting:
            jobs.append(cycle_job(queue, table, after_cycle))
            sensors.append(waiting_sensor(declaration, queue, table, broken.get(queue)))
        jobs.append(cycle_job(queue, TRANSMISSION, after_cycle))
        sensors.append(transmission_sensor(declaration, queue))
        jobs.append(queue_disabled_job(declaration, queue))
        sensors.append(queue_disabled_sensor(declaration, queue))
        jobs.append(messages_failed_job(declaration, queue))
        sensors.append(messages_failed_sensor(declaration, queue))
        jobs.append(action_left_job(declaration, queue))
        sensors.append(action_left_sensor(declaration, queue))
        if (problem := broken.get(queue)) is not None:
            jobs.append(user_code_broken_job(declaration, queue))
            sensors.append(user_code_broken_sensor(queue, problem))
        if declaration.queue(queue).policy.outage_recovery is OutageRecovery.PROBE:
            jobs.append(queue_recovered_job(declaration, queue))
            sensors.append(queue_recovered_sensor(declaration, queue))
        # The operator's console: redrive by failure day or group, actions with typed config, retention.
        assets += [redrive_asset(declaration, queue), redrive_group_asset(declaration, queue)]
        jobs += [redrive_job(queue), redrive_group_job(queue), *operator_jobs(declaration, queue)]
        sensors.append(failure_groups_sensor(declaration, queue))
        schedules += [*retention_schedules(declaration, queue), *maintenance_schedules(declaration, queue)]
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources={"spark": SparkResource.from_settings(declaration.spark)},
        # Every step of a run shares one process and so one Spark session.
        executor=in_process_executor,
    )
