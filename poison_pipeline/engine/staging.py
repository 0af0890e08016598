"""A big cycle's staged results, written by its Spark tasks with pyarrow.

Handing the results back to the JVM to write them would convert every staged column (bodies
included) from Arrow into Spark rows and back into parquet: that alone cost more than the
plain pass's whole write. Each task writes the Arrow batches its Processor yields to parquet files
of its own in the staging folder (shared storage under the lake root, which every worker reaches),
its processed messages' ledger rows apart from its other rows (engine/staged.py), and returns one
row naming each file; the driver keeps exactly the files those rows name.

A task writes each file whole or not at all (storage/uri.whole: locally under a hidden temporary
name renamed when complete, on an object store an upload completed only then), so a task that dies
(or a retried attempt) never leaves half a file where the commit reads; a file not named by the job
that succeeded (one a killed earlier run finished late) is removed before the cycle is marked staged.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from poison_pipeline.engine import staged
from poison_pipeline.engine.batch import CycleSpec, Processor
from poison_pipeline.engine.id_hashes import HASH_COLUMN
from poison_pipeline.storage import schemas
from poison_pipeline.storage.journal import remove_tree
from poison_pipeline.storage.uri import fs_of, whole_in

_WRITTEN = pa.schema([pa.field("file", pa.string()), pa.field("rows", pa.int64())])


class _TaskWriter:
    """Runs the Processor of one task and writes what it yields; instances live on the executors."""

    def __init__(self, processor: Processor, staging: str, token: str) -> None:
        self.processor = processor
        self.staging = staging
        self.token = token

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        fs, folder = fs_of(self.staging, self.processor.spec.storage_options)
        fs.create_dir(folder, recursive=True)
        names = [f"{prefix}{partition:05d}-{self.token}.parquet" for prefix in (staged.LEDGER_PREFIX,
                                                                              staged.MOVED_PREFIX)]
        # The id hashes Spark computed as it read the rows: the Processor yields one result per
        # batch, in order, so each result takes the hashes of the batch it came from.
        hashes: deque[pa.Array] = deque()

        def hashed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                hashes.append(batch.column(HASH_COLUMN))
                yield batch

        # Each file appears whole when its block ends, or never (the task failed or died in it).
        with (whole_in(fs, f"{folder}/{names[0]}") as ledger_file, whole_in(fs, f"{folder}/{names[1]}") as moved_file,
              _Grouped(pq.ParquetWriter(ledger_file, staged.LEDGER, **staged.FILE_OPTIONS)) as ledger,
              _Grouped(pq.ParquetWriter(moved_file, staged.STAGED, **staged.FILE_OPTIONS)) as moved):
            for result in self.processor(hashed(batches)):
                parts = staged.split(pa.RecordBatch.from_arrays([*result.columns, hashes.popleft()],
                                                                schema=staged.STAGED))
                ledger.add(parts[0])
                moved.add(parts[1])
        for name, written in zip(names, (ledger, moved), strict=True):
            yield pa.RecordBatch.from_pylist([{"file": name, "rows": written.rows}], schema=_WRITTEN)


class _Grouped:
    """A parquet writer fed batches of any size that writes row groups of ROW_GROUP rows: the file of
    the few rows a cycle moves would otherwise hold a row group of a handful of rows per batch, which
    made the commit's reads slower than the rows it spared them."""

    ROW_GROUP = 65_536

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self.pending: list[pa.RecordBatch] = []
        self.held = 0
        self.rows = 0

    def __enter__(self) -> _Grouped:
        return self

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.pending.append(batch)
            self.held += batch.num_rows
            self.rows += batch.num_rows
        if self.held >= self.ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending), row_group_size=self.held)
        self.pending, self.held = [], 0

    def __exit__(self, *failure: object) -> None:
        if failure[0] is None:
            self._flush()
        self.writer.close()


def stage_on_spark(batch: DataFrame, spec: CycleSpec, staging: str, null_columns: Sequence[str] = ()) -> None:
    """Deliver `batch` in one Spark job whose tasks write the staged results to `staging`.
    `null_columns`: message columns null in every row, which the tasks restore rather than receive."""
    remove_tree(staging, spec.storage_options)  # what a failed delivery left: nothing of it may be committed
    token = uuid.uuid4().hex[:12]
    # Every column costs the JVM a conversion to Arrow per row: a fresh message has nine null ones.
    batch = batch.drop(*(name for name in null_columns if name in schemas.MESSAGE.names))
    # Hashed as Spark reads the ids, in the JVM, rather than one `xxhash` call per id in the task's Python.
    batch = batch.withColumn(HASH_COLUMN, F.xxhash64("message_id"))
    written = batch.mapInArrow(_TaskWriter(Processor(spec), staging, token), from_arrow_schema(_WRITTEN)).collect()
    keep = {row["file"] for row in written}
    fs, folder = fs_of(staging, spec.storage_options)
    fs.create_dir(folder, recursive=True)  # a batch without rows still stages an empty folder
    for info in fs.get_file_info(pafs.FileSelector(folder)):
        if info.base_name not in keep:
            fs.delete_file(info.path)
