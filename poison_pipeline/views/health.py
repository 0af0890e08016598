"""A queue's health as numbers, for plots: how many messages each place holds and how many failed in
the last hour.

The depths come from the Delta logs' file statistics and are kept until a table changes
(storage/memo.py): a request per table when nothing did. The last hour's failures are counted from
the failure tables' failure times (one column, row groups outside the hour skipped), so a message
that failed and left since (redriven, purged) is not among them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow.dataset as pads

from poison_pipeline.domain.routing import FAILED_AT, FAILURE_TABLES
from poison_pipeline.storage.memo import remembered
from poison_pipeline.storage.tables import QueueTables

__all__ = ["RECENT", "Health", "health"]

RECENT = timedelta(hours=1)


@dataclass(frozen=True)
class Health:
    depths: dict[str, int]  # messages in each waiting and failure table
    failed_recently: int  # of those in the failure tables, the ones that failed within RECENT


def health(tables: QueueTables, *, now: datetime | None = None) -> Health:
    """The queue's depths and its failures within the last hour, as of now."""
    now = now or datetime.now(UTC)
    places = (*tables.waiting, *(t for t in FAILURE_TABLES if t not in tables.waiting))
    depths: dict[str, int] = remembered(tables, "health-depths", lambda read: {
        table: read.open(table).count() if read.exists(table) else 0 for table in places}, dict, dict)
    since = now - RECENT
    recent = 0
    for table in FAILURE_TABLES:
        if depths.get(table):
            dataset = tables.open(table).to_pyarrow_dataset()
            recent += int(dataset.count_rows(filter=pads.field(FAILED_AT[table]) >= since))
    return Health(depths, recent)
