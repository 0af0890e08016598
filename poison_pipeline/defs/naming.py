"""Names of the Dagster objects of a queue, in one place so sensors, jobs and assets agree."""

from __future__ import annotations

from dagster import AssetKey

from poison_pipeline.storage.control import QUEUE_DISABLED

QUEUE_TAG = "poison_pipeline/queue"
# Alert runs name their queue under a tag of their own: dagster.yaml limits runs per value of
# QUEUE_TAG, and an alert must neither wait behind that queue's cycles nor hold one back.
ALERT_TAG = "poison_pipeline/alert_queue"
EVENT_TAG = "poison_pipeline/event_id"
# A cycle run the inbound sensor requested as a probe of a queue an outage disabled.
PROBE_TAG = "poison_pipeline/probe"
# The tags Dagster's sensor daemon puts on the runs it launches. Dagster exports no public name for
# them; test_alerts checks these against its private ones, so an upgrade that renames them fails there.
RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"


def asset_key(queue: str, table: str) -> AssetKey:
    return AssetKey([queue, table])


def job_name(queue: str, table: str) -> str:
    return f"{queue}__{table}_cycle"


def sensor_name(queue: str, table: str) -> str:
    return f"{queue}__{table}_sensor"


def alert_job_name(queue: str, kind: str = QUEUE_DISABLED) -> str:
    """`<queue>__queue_disabled_alert`, `<queue>__messages_failed_alert`: one alert job per event kind."""
    return f"{queue}__{kind}_alert"


def alert_sensor_name(queue: str, kind: str = QUEUE_DISABLED) -> str:
    return f"{queue}__{kind}_sensor"


REDRIVE = "redrive"
OPERATOR_ACTIONS = ("enable", "end_conversation", "edit", "purge", "archive", "restore", "undo", "simulate")
SIMULATION = "policy_simulation"
# Who launched a run, when its config names nobody: Dagster+ sets dagster/user; a launcher of our own
# (a script, a sensor) can set ACTOR_TAG, which wins.
ACTOR_TAG = "poison_pipeline/actor"
# On an operator's run once it knows: whether it only previews (`true`) or acts (`false`).
DRY_RUN_TAG = "poison_pipeline/dry_run"
USER_TAG = "dagster/user"


def redrive_asset_key(queue: str) -> AssetKey:
    return AssetKey([queue, REDRIVE])


def simulation_asset_key(queue: str) -> AssetKey:
    """Where the `simulate` job records its report (an asset observed, not one the pipeline makes)."""
    return AssetKey([queue, SIMULATION])


REDRIVE_GROUP = "redrive_group"


def redrive_group_asset_key(queue: str) -> AssetKey:
    """The redrive asset partitioned by failure group."""
    return AssetKey([queue, REDRIVE_GROUP])


def redrive_group_job_name(queue: str) -> str:
    return f"{queue}__{REDRIVE_GROUP}_job"


def failure_groups_partitions_name(queue: str) -> str:
    """The dynamic partitions of `redrive_group`: the queue's failure group ids."""
    return f"{queue}__failure_groups"


def failure_groups_sensor_name(queue: str) -> str:
    return f"{queue}__failure_groups_sensor"


def redrive_job_name(queue: str) -> str:
    # Not `{queue}__redrive`: that is the redrive asset's op.
    return f"{queue}__{REDRIVE}_job"


def operator_job_name(queue: str, action: str) -> str:
    return f"{queue}__{action}"


def retention_schedule_name(queue: str) -> str:
    return f"{queue}__retention"


def retention_job_name(queue: str) -> str:
    return f"{queue}__retention_purge"


def operator_op_name(queue: str, action: str) -> str:
    """The op of an operator job (the Launchpad's `ops:` key): op names are unique in a repository."""
    return f"{queue}__{action}_op"


def maintenance_job_name(queue: str) -> str:
    return f"{queue}__maintenance"


def maintenance_schedule_name(queue: str) -> str:
    return f"{queue}__maintenance"
