"""Finding the messages of a cycle that must not be delivered again: duplicate message ids.

The processed ledger keeps a 64-bit hash of every id (`id_hash`, Spark's xxhash64), so a cycle
scans that one int64 column of the dedup window instead of every id string, then confirms the few
hash hits by reading the ids of the files they are in: dedup stays exact whatever collides. Ledger
files written before the column existed (or without it) are compared by id, as before.

A small batch is probed on the driver with pyarrow (no Spark job); a big one in Spark, where its
duplicates become a column of the batch, so nothing per message comes back to the driver.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from poison_pipeline.domain.routing import PROCESSED, Disposition
from poison_pipeline.engine.batch import DUPLICATE_COLUMN
from poison_pipeline.engine.id_hashes import HASH_COLUMN, id_hashes
from poison_pipeline.engine.reading import read_files
from poison_pipeline.engine.session import cores
from poison_pipeline.storage.files import files_dataset, log_names
from poison_pipeline.storage.tables import QueueTables

# Up to this many due messages a batch is probed on the driver: its ids fit there at no cost,
# and no Spark job is spent on it. Above, the probe runs in Spark.
SMALL_BATCH = 50_000
# A duplicate set up to this size is broadcast to the batch's tasks; a bigger one is shuffled.
_BROADCAST_ROWS = 100_000
_PROCESSED = Disposition.PROCESSED.value


# What dedup reads of the ledger.
_LEDGER = pa.schema([pa.field("message_id", pa.string()), pa.field("disposition", pa.string()),
                     pa.field(HASH_COLUMN, pa.int64())])


@dataclass(frozen=True)
class Ledger:
    """The processed ledger's files within the dedup window, by how they are probed."""

    tables: QueueTables
    # Files whose every row has its id hash, and files compared by id (written before the hash).
    hashed: tuple[str, ...]
    legacy: tuple[str, ...]
    sizes: dict[str, int]

    @classmethod
    def within(cls, tables: QueueTables, window_start: str, *, snapshot: DeltaTable | None = None) -> Ledger:
        """The files of partitions `date >= window_start`, from the Delta log alone. `snapshot`: the
        ledger as the caller holds it (a writer's `latest`), else it is loaded."""
        ledger = snapshot if snapshot is not None else tables.open(PROCESSED)
        actions = pa.table(ledger.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return cls(tables, (), (), {})
        actions = actions.filter(pc.greater_equal(actions["partition.date"], window_start))
        nulls = f"null_count.{HASH_COLUMN}"
        # No statistic for the column: a file written before it existed (its rows read as null).
        hashed = (pc.equal(actions[nulls], 0) if nulls in actions.column_names
                  else pa.array([False] * actions.num_rows))
        hashed = pc.fill_null(hashed, False)
        paths = actions["path"]
        sizes = dict(zip(paths.to_pylist(), actions["size_bytes"].to_pylist(), strict=True))
        return cls(tables, tuple(paths.filter(hashed).to_pylist()),
                   tuple(paths.filter(pc.invert(hashed)).to_pylist()), sizes)

    def dataset(self, paths: Iterable[str]) -> pads.Dataset:
        paths = list(paths)
        return files_dataset(self.tables.uri(PROCESSED), self.tables.storage_options, paths,
                             [self.sizes[p] for p in paths], _LEDGER)

    def uris(self, paths: Iterable[str]) -> list[str]:
        return [f"{self.tables.uri(PROCESSED)}/{path}" for path in paths]

    def read(self, spark: SparkSession, uris: list[str], schema: pa.Schema,
             file_column: str | None = None) -> DataFrame:
        """The files `uris` in Spark, with `schema`'s columns (and each row's file, as a URI the
        reader reads again, as `file_column`)."""
        root = f"{self.tables.uri(PROCESSED)}/"
        return read_files(spark, uris, schema, self.tables.storage_options,
                          sizes=[self.sizes.get(uri.removeprefix(root), 0) for uri in uris], file_column=file_column)


@dataclass(frozen=True)
class Duplicates:
    seen: frozenset[str]
    losers: frozenset[tuple[str, str]]


def find_duplicates(batch: pa.Table, ledger: Ledger) -> Duplicates:
    """On the driver, for a small `batch` (message_id, batch_id, enqueued_at): ids already
    processed, and for ids that occur more than once in the batch, every occurrence but the
    earliest enqueued."""
    ids = pc.unique(batch["message_id"])
    return Duplicates(_processed(ids, ledger), _losers(batch))


def _processed(ids: pa.Array, ledger: Ledger) -> frozenset[str]:
    if len(ids) == 0:
        return frozenset()
    suspects: list[str] = []
    if ledger.hashed:
        hits = ledger.dataset(ledger.hashed).to_table(
            columns=[HASH_COLUMN, "__filename"], filter=pc.field(HASH_COLUMN).isin(id_hashes(ids.to_pylist())))
        suspects = sorted(set(log_names(hits["__filename"].to_pylist(), ledger.hashed)))
    files = [*ledger.legacy, *suspects]
    if not files:
        return frozenset()
    # Confirmed by id: a hash hit of another id (a collision) is no duplicate.
    found = ledger.dataset(files).to_table(
        columns=["message_id"],
        filter=pc.field("message_id").isin(ids) & (pc.field("disposition") == _PROCESSED))
    return frozenset(found["message_id"].to_pylist())


def _losers(batch: pa.Table) -> frozenset[tuple[str, str]]:
    counts = batch.group_by("message_id", use_threads=False).aggregate([([], "count_all")])
    twins = counts.filter(pc.greater(counts["count_all"], 1))["message_id"]
    if len(twins) == 0:
        return frozenset()
    copies: dict[str, list[tuple[object, str]]] = {}
    for row in batch.filter(pc.is_in(batch["message_id"], value_set=twins)).to_pylist():
        copies.setdefault(row["message_id"], []).append((row["enqueued_at"], row["batch_id"]))
    # The earliest enqueued copy is delivered; every later one is a duplicate.
    return frozenset((mid, batch_id) for mid, found in copies.items() for _, batch_id in sorted(found)[1:])


def _hash_of_id() -> Column:
    """The column that screens a big batch for twins: Spark's xxhash64, cheap to group by where id
    strings are not (a hook so that a test can force collisions)."""
    return F.xxhash64("message_id")


# Spark 4's switch for grouping keys that are nearly all distinct, as the ids of a batch are: the
# partial aggregation before the shuffle would keep every row and only cost its hash table.
_BYPASS_PARTIAL = "spark.sql.execution.bypassPartialAggregation"
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
_ADAPTIVE = "spark.sql.adaptive.enabled"


def _twins_settings(spark: SparkSession) -> dict[str, str]:
    """The twins job's own settings. Its shuffle gets one partition per core where the session
    knows its cores (a Spark Connect client does not), and then no adaptive planning: the session's
    partitions, fewer or more, were coalesced into uneven tasks (4 into 3 on 2 cores, one core idle
    for the last third), and the adaptive plan ran the job as two, each paying its scheduling."""
    settings = {_BYPASS_PARTIAL: "true"}
    known = cores(spark)
    if known is not None:
        settings[_SHUFFLE_PARTITIONS] = str(known)
        settings[_ADAPTIVE] = "false"
    return settings


@contextlib.contextmanager
def _job_settings(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """`settings` for the job run inside, and only that job: the session's other groupings (counts
    per failure group, per file) have few keys, where the partial aggregation is what makes them
    cheap, and its other shuffles keep their own partitions."""
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, earlier in before.items():
            if earlier is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, earlier)


def _twins(ids: DataFrame) -> DataFrame | None:
    """Every copy but the earliest enqueued of each id repeated in `ids` (message_id, batch_id), or
    None when no id is: grouped by id hash first, so the ids are compared only where a hash repeats."""
    hashed = ids.withColumn(HASH_COLUMN, _hash_of_id())
    repeated = hashed.groupBy(HASH_COLUMN).count().where("count > 1").select(HASH_COLUMN)
    # Not cached: when a hash repeats (rare), grouping again costs less than a cache kept per cycle.
    with _job_settings(ids.sparkSession, _twins_settings(ids.sparkSession)):
        if repeated.isEmpty():
            return None
    # Confirmed by id: two ids sharing a hash are no twins.
    candidates = hashed.join(repeated, HASH_COLUMN, "left_semi").select("message_id", "batch_id", "enqueued_at")
    first = Window.partitionBy("message_id").orderBy("enqueued_at", "batch_id")
    twins = candidates.groupBy("message_id").count().where("count > 1").select("message_id")
    return (candidates.join(twins, "message_id", "left_semi").withColumn("rank", F.row_number().over(first))
            .where("rank > 1").select("message_id", "batch_id"))


def mark_duplicates(spark: SparkSession, batch: DataFrame, ledger: Ledger, held: contextlib.ExitStack) -> DataFrame:
    """In Spark, for a big `batch`: the batch with a boolean DUPLICATE_COLUMN, true for ids already
    processed and for every copy but the earliest enqueued of an id repeated in the batch. What it
    caches for the job that reads the result is released when `held` closes."""
    ids = batch.select("message_id", "batch_id", "enqueued_at")
    files = ledger.uris(ledger.legacy)
    if ledger.hashed:
        hashes = ids.select(F.xxhash64("message_id").alias(HASH_COLUMN)).distinct()
        hits = (ledger.read(spark, ledger.uris(ledger.hashed), pa.schema([_LEDGER.field(HASH_COLUMN)]),
                            file_column="file")
                .join(hashes, HASH_COLUMN, "left_semi").select("file").distinct().collect())
        files += sorted(r["file"] for r in hits)  # one row per ledger file with a hit, not per message
    found = [] if (twins := _twins(ids)) is None else [twins]
    if files:
        done = (ledger.read(spark, files, _LEDGER.remove(_LEDGER.get_field_index(HASH_COLUMN)))
                .where(F.col("disposition") == _PROCESSED).select("message_id").distinct())
        found.append(ids.join(done, "message_id", "left_semi").select("message_id", "batch_id"))
    if not found:
        return batch  # the common case: one job over the batch's id hashes, no join
    duplicates = functools.reduce(DataFrame.unionByName, found)
    duplicates = duplicates.distinct().withColumn(DUPLICATE_COLUMN, F.lit(True)).cache()
    held.callback(duplicates.unpersist)
    if (count := duplicates.count()) == 0:
        return batch
    right = F.broadcast(duplicates) if count <= _BROADCAST_ROWS else duplicates
    # A left join keyed by both columns keeps every batch row once; a null batch_id matches nothing.
    marked = batch.join(right, ["message_id", "batch_id"], "left")
    return marked.withColumn(DUPLICATE_COLUMN, F.coalesce(F.col(DUPLICATE_COLUMN), F.lit(False)))
