"""Names of the Dagster objects of a queue, in one place so sensors, jobs and assets agree."""

from __future__ import annotations

from dagster import AssetKey

QUEUE_TAG = "poison_pipeline/queue"


def asset_key(queue: str, table: str) -> AssetKey:
    return AssetKey([queue, table])


def job_name(queue: str, table: str) -> str:
    return f"{queue}__{table}_cycle"


def sensor_name(queue: str, table: str) -> str:
    return f"{queue}__{table}_sensor"
