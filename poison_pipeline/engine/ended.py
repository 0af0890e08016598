"""Messages of conversations ended with an error, marked in Spark for a big cycle."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from poison_pipeline.broker.conversations import ENDED
from poison_pipeline.engine.batch import ENDED_COLUMN
from poison_pipeline.engine.reading import read_files
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import CONVERSATIONS, QueueTables


def mark_ended(spark: SparkSession, batch: DataFrame, tables: QueueTables) -> DataFrame:
    """The batch with ENDED_COLUMN, true for messages of a conversation ended in this queue: a
    join in Spark, where a small cycle reads `ended_conversations` into its spec."""
    files = tables.open(CONVERSATIONS).file_uris() if tables.exists(CONVERSATIONS) else []
    if not files:
        return batch
    ended = (read_files(spark, files, schemas.CONVERSATIONS, tables.storage_options)
             .where(F.col("state") == ENDED).select("conversation_id").distinct()
             .withColumn(ENDED_COLUMN, F.lit(True)))
    # A message without a conversation matches nothing and keeps its row.
    marked = batch.join(ended, "conversation_id", "left")
    return marked.withColumn(ENDED_COLUMN, F.coalesce(F.col(ENDED_COLUMN), F.lit(False)))
