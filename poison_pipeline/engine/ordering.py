"""Conversation ordering (SPEC section 5 `ordering: conversation`): a conversation's messages are
handled by one executor in sequence order, and never ahead of an earlier one waiting elsewhere."""

from __future__ import annotations

from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from poison_pipeline.engine.batch import BLOCKED_COLUMNS, Blocked
from poison_pipeline.engine.reading import read_files
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import QueueTables

# Within a conversation (keyed by conversation id, else by message id: a message without a
# conversation is a conversation of its own), every sort key ascending, nulls first.
_WITHIN = ("sequence_number", "enqueued_at", "message_id")


def in_conversation_order(frame: DataFrame) -> DataFrame:
    """All messages of a conversation in one partition, sorted by sequence number; other
    conversations spread over the partitions so they proceed in parallel."""
    # Keyed by id, messages without a conversation do not pile up in one partition.
    key = F.coalesce(F.col("conversation_id"), F.col("message_id"))
    return frame.repartition(key).sortWithinPartitions(key.asc_nulls_first(),
                                                       *(F.col(c).asc_nulls_first() for c in _WITHIN))


def sorted_in_conversation_order(rows: pa.Table) -> pa.Table:
    """The rows of a small cycle, delivered as one partition: in the order `in_conversation_order`
    gives each partition."""
    keyed = rows.append_column("_conversation_key", pc.coalesce(rows["conversation_id"], rows["message_id"]))
    keys = [(c, "ascending", "at_start") for c in ("_conversation_key", *_WITHIN)]
    return rows.take(pc.sort_indices(keyed, sort_keys=keys))


def blocked_conversations(tables: QueueTables, table: str, batches: list[str]) -> dict[str, Blocked]:
    """For each conversation of the due `batches` of `table` that also has messages waiting in
    another waiting table: the table holding its earliest one, that sequence number and its due time."""
    due = tables.open(table).to_pyarrow_dataset().to_table(
        columns=["conversation_id"], filter=pc.field("batch_id").isin(batches)
    )
    conversations = pc.unique(pc.drop_null(due["conversation_id"]))
    if len(conversations) == 0:
        return {}
    found: dict[str, Blocked] = {}
    for other in tables.waiting:
        if other == table or not tables.exists(other):
            continue
        # Messages without a sequence number take no part in ordering: they hold nothing back.
        rows = tables.open(other).to_pyarrow_dataset().to_table(
            columns=["conversation_id", "sequence_number", "due_at"],
            filter=pc.field("conversation_id").isin(conversations) & pc.field("sequence_number").is_valid(),
        )
        if rows.num_rows == 0:
            continue
        heads = rows.group_by("conversation_id").aggregate([("sequence_number", "min"), ("due_at", "min")])
        for row in heads.to_pylist():
            candidate = Blocked(other, row["sequence_number_min"], row["due_at_min"])
            current = found.get(row["conversation_id"])
            if current is None or _earlier(candidate, current):
                found[row["conversation_id"]] = candidate
    return found


def _earlier(a: Blocked, b: Blocked) -> bool:
    return a.sequence_number < b.sequence_number


def mark_blocked(spark: SparkSession, batch: DataFrame, tables: QueueTables, table: str) -> DataFrame:
    """What `blocked_conversations` finds, as BLOCKED_COLUMNS of the batch (null: not blocked),
    joined in Spark for a big cycle instead of collected on the driver."""
    name, sequence, due = BLOCKED_COLUMNS
    heads = []
    for order, other in enumerate(tables.waiting):
        files = tables.open(other).file_uris() if other != table and tables.exists(other) else []
        if not files:
            continue
        rows = read_files(spark, files, schemas.MESSAGE, tables.storage_options).where(
            F.col("conversation_id").isNotNull() & F.col("sequence_number").isNotNull())
        heads.append(rows.groupBy("conversation_id").agg(F.min("sequence_number").alias(sequence),
                                                         F.min("due_at").alias(due))
                     .withColumn(name, F.lit(other)).withColumn("_order", F.lit(order)))
    if not heads:
        return batch
    # The lowest sequence number wins; on a tie, the table earlier in flow order (as _earlier keeps it).
    first = Window.partitionBy("conversation_id").orderBy(sequence, "_order")
    head = (reduce(DataFrame.unionByName, heads).withColumn("_rank", F.row_number().over(first))
            .where("_rank = 1").select("conversation_id", name, sequence, due))
    return batch.join(head, "conversation_id", "left")
