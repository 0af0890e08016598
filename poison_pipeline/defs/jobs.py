"""One job per waiting table, run in-process so a run builds a single Spark session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster import AssetCheckKey, AssetSelection, define_asset_job, in_process_executor

from poison_pipeline.defs.naming import QUEUE_TAG, asset_key, job_name

if TYPE_CHECKING:
    from poison_pipeline.runs.dagster_types import UnresolvedAssetJobDefinition


def cycle_job(queue: str, table: str, checks: Sequence[AssetCheckKey] = ()) -> UnresolvedAssetJobDefinition:
    """`checks` run in the same run, after the cycle (their step depends on every cycle asset)."""
    return define_asset_job(
        name=job_name(queue, table),
        selection=AssetSelection.assets(asset_key(queue, table)) | AssetSelection.checks(*checks),
        executor_def=in_process_executor,
        tags={QUEUE_TAG: queue},
        description=f"Materializes {queue}/{table}: one cycle of a waiting table, or an offer of sent messages.",
    )
