"""The message id hash the processed ledger carries beside each id (Spark's `xxhash64`), computed
on the driver without Spark, so that committing a staged cycle needs no Spark import."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import xxhash

HASH_COLUMN = "id_hash"
# Spark's xxhash64 seed: the driver's hashes must equal those Spark writes.
_SEED = 42


def id_hash(message_id: str) -> int:
    """Spark's `xxhash64(message_id)`: XXH64 of the UTF-8 bytes, seed 42, as a signed int64."""
    value = xxhash.xxh64_intdigest(message_id.encode(), _SEED)
    return value - (1 << 64) if value >= 1 << 63 else value


def id_hashes(ids: Iterable[str | None]) -> pa.Array:
    return pa.array([None if i is None else id_hash(i) for i in ids], pa.int64())
