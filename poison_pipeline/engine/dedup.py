"""Finding the messages of a cycle that must not be delivered again: duplicate message ids."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


@dataclass(frozen=True)
class Duplicates:
    seen: frozenset[str]
    losers: frozenset[tuple[str, str]]


def find_duplicates(spark: SparkSession, batch: DataFrame, ledger_files: list[str]) -> Duplicates:
    """Ids already processed (within the ledger files given) and, for ids that occur more than once
    in the batch, every occurrence but the earliest enqueued.

    Only the id columns are shuffled, and only duplicates come back to the driver.
    """
    ids = batch.select("message_id", "batch_id", "enqueued_at", F.lit(0).alias("src"))
    if ledger_files:
        done = (
            spark.read.parquet(*ledger_files)
            .where(F.col("disposition") == "processed")
            .select(
                "message_id",
                F.lit(None).cast("string").alias("batch_id"),
                F.lit(None).cast("timestamp").alias("enqueued_at"),
                F.lit(1).alias("src"),
            )
        )
        ids = ids.unionByName(done)
    repeated = ids.groupBy("message_id").agg(
        F.count(F.lit(1)).alias("n"),
        F.max("src").alias("processed"),
        F.min("src").alias("in_batch"),
        F.collect_list(F.struct("enqueued_at", "batch_id", "src")).alias("copies"),
    ).where("n > 1 AND in_batch = 0")
    seen: set[str] = set()
    losers: set[tuple[str, str]] = set()
    for row in repeated.toLocalIterator():
        if row["processed"]:
            seen.add(row["message_id"])
            continue
        copies = sorted((c["enqueued_at"], c["batch_id"]) for c in row["copies"] if c["src"] == 0)
        losers.update((row["message_id"], batch_id) for _, batch_id in copies[1:])
    return Duplicates(frozenset(seen), frozenset(losers))
