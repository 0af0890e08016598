"""The batches that hold an operator action's copies, found by their whole names (domain/names.py)."""

from __future__ import annotations

import pyarrow.compute as pc

from poison_pipeline.domain.names import AppTransaction, BatchName
from poison_pipeline.domain.routing import INBOUND
from poison_pipeline.storage.tables import QueueTables

__all__ = ["redrive_batches"]


def redrive_batches(target: QueueTables, source_queue: str, redrive_id: str) -> pc.Expression:
    """A filter on `batch_id`: the copies that redrive `redrive_id` of `source_queue` wrote to
    `target`'s inbound. Their earlier form (`<id>-<chunk>`) counts only when the redrive committed
    them under the name an earlier version gave its commits: this version's transmissions and cycles
    write batch ids of that form (`tx-orders-5` is orders' sends, not chunk 5 of a redrive named
    tx-orders)."""
    inbound = target.open_if_exists(INBOUND)
    app = AppTransaction.redrive(source_queue, redrive_id, legacy=True)
    earlier = inbound is not None and inbound.transaction_version(str(app)) is None \
        and inbound.transaction_version(app.name) is not None
    return pc.match_substring_regex(pc.field("batch_id"), pattern=BatchName.pattern(redrive_id, earlier=earlier))
