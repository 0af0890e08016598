"""What a delivery stages for its commit: the ledger rows of the messages processed, and every other
row in full, in files of their own.

A message processed for good is staged with only what the processed and attempts ledgers keep and
where it went: the rest of its row (its body above all) is never read again. The few rows a cycle
moves elsewhere (retries, poison, dead letters) are in files without a processed row, so the commit's
reads of them skip the ledger files by their statistics rather than read past every processed row.
"""

from __future__ import annotations

from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.domain.routing import PROCESSED
from poison_pipeline.storage import schemas
from poison_pipeline.storage.uri import fs_of

Rows = TypeVar("Rows", pa.RecordBatch, pa.Table)

# A staged row: the Processor's result and, for the processed ledger, the id hash (both delivery
# paths stage it; null only in rows an older version staged, hashed by the commit).
STAGED = schemas.RESULT.append(schemas.PROCESSED.field("id_hash"))
_KEPT = frozenset(schemas.PROCESSED.names) | {"destination", "disposition", "reason", "attempts", "sent"}
LEDGER = pa.schema([f for f in STAGED if f.name in _KEPT])
LEDGER_PREFIX = "ledger-"
MOVED_PREFIX = "part-"

# A staged file is read once, by the commit, whose filters only look at these columns: statistics
# for the rest and dictionaries (most columns are unique ids, or nulls) cost the tasks a third more
# to write than the file saves.
FILE_OPTIONS = {"compression": "lz4", "use_dictionary": False,
                "write_statistics": ["destination", "disposition", "sent"]}


def split(rows: Rows) -> tuple[Rows, Rows]:
    """Staged rows (STAGED) as their processed rows (LEDGER) and their other rows (STAGED)."""
    processed = pc.equal(rows.column("destination"), PROCESSED)
    ledger = rows.select(LEDGER.names)
    kept = pc.sum(processed).as_py() or 0
    if kept == rows.num_rows:
        return ledger, rows.slice(0, 0)
    if kept == 0:
        return ledger.slice(0, 0), rows
    return ledger.filter(processed), rows.filter(pc.invert(processed))


def dataset(staging: str, storage_options: dict[str, str]) -> pads.Dataset:
    """Every row staged in the folder `staging` (under the root of the lake whose `storage_options`
    these are), as STAGED rows (a ledger file's other columns null)."""
    fs, path = fs_of(staging, storage_options)
    return pads.dataset(path, format="parquet", schema=STAGED, filesystem=fs)
