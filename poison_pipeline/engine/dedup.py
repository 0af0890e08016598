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
    # Plain counts per id keep the aggregate a hash aggregate; only the few repeated ids come back.
    repeated = (
        ids.groupBy("message_id")
        .agg(F.count(F.lit(1)).alias("n"), F.max("src").alias("processed"), F.min("src").alias("in_batch"))
        .where("n > 1 AND in_batch = 0")
        .collect()
    )
    seen = frozenset(r["message_id"] for r in repeated if r["processed"])
    twins = [r["message_id"] for r in repeated if not r["processed"]]
    if not twins:
        return Duplicates(seen, frozenset())
    wanted = spark.createDataFrame([(t,) for t in twins], "message_id string")
    copies: dict[str, list[tuple[object, str]]] = {}
    for row in batch.select("message_id", "batch_id", "enqueued_at").join(F.broadcast(wanted), "message_id").collect():
        copies.setdefault(row["message_id"], []).append((row["enqueued_at"], row["batch_id"]))
    # The earliest enqueued copy is delivered; every later one is a duplicate.
    losers = frozenset((mid, batch_id) for mid, found in copies.items() for _, batch_id in sorted(found)[1:])
    return Duplicates(seen, losers)
