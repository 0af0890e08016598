"""Lake files as a Spark DataFrame: Spark's own Parquet reader on a local lake, Arrow tasks on an
object store.

Spark's reader reaches an object store through Hadoop's connectors (for S3, `hadoop-aws` and the AWS
SDK: Maven artifacts that every executor needs, matched to the cluster's Hadoop). Arrow tasks reach
it as the rest of the product does, through pyarrow and delta-rs's object_store with the lake's
`storage_options`, so a worker needs only this package's pip dependencies. On a local or mounted
folder Spark's own reader needs no connector and stays; `benchmarks/lake_reader.py` times a big
cycle with each reader on a local lake.

An Arrow task reads a part of the files: a file the Delta log shows larger than `_PART_BYTES` is
split into parts that each read every n-th of its row groups, so one big enqueue is still read (and
then delivered) by as many tasks as Spark's reader would give it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from poison_pipeline.engine.session import cores
from poison_pipeline.storage.uri import fs_of_all, is_local

__all__ = ["read_files"]

# As Spark's own reader splits files (spark.sql.files.maxPartitionBytes' default).
_PART_BYTES = 128 * 1024 * 1024
_PARTS = pa.schema([pa.field("uri", pa.string()), pa.field("part", pa.int32()), pa.field("parts", pa.int32())])


def read_files(session: SparkSession, uris: Sequence[str], schema: pa.Schema, storage_options: dict[str, str], *,
               sizes: Sequence[int] | None = None, file_column: str | None = None,
               arrow: bool | None = None) -> DataFrame:
    """The Parquet files `uris` (of one lake, whose `storage_options` these are) as one DataFrame of
    `schema`, a column a file lacks read as nulls. `sizes`: the files' sizes as the Delta log gives
    them (a big file is then read by several tasks). `file_column`: a column holding each row's
    file, as given in `uris`. `arrow`: read by Arrow tasks (default: when the lake is not local)."""
    if arrow is None:
        arrow = bool(uris) and not is_local(uris[0])
    if not arrow:
        frame = session.read.schema(from_arrow_schema(schema)).parquet(*uris)
        return frame if file_column is None else frame.withColumn(file_column, F.input_file_name())
    parts = [(uri, part, count) for uri, size in zip(uris, sizes or [0] * len(uris), strict=True)
             for count in [max(1, math.ceil(size / _PART_BYTES))] for part in range(count)]
    out = schema if file_column is None else schema.append(pa.field(file_column, pa.string()))
    listed = session.createDataFrame(parts, from_arrow_schema(_PARTS))
    # Up to two tasks per core, as Spark's reader packs small files into splits (a Connect client
    # does not know the cores: it asks for as many as a small cluster has).
    slices = max(1, min(len(parts), 2 * (cores(session) or 8)))
    return listed.repartition(slices).mapInArrow(_PartReader(schema, storage_options, file_column),
                                                 from_arrow_schema(out))


class _PartReader:
    """Reads the parts a task is given; instances live on the executors."""

    def __init__(self, schema: pa.Schema, storage_options: dict[str, str], file_column: str | None) -> None:
        self.schema = schema
        self.storage_options = storage_options
        self.file_column = file_column

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for listed in batches:
            uris, part, parts = (listed.column(name).to_pylist() for name in _PARTS.names)
            if not uris:
                continue
            fs, paths = fs_of_all(uris, self.storage_options)
            for uri, path, one, of in zip(uris, paths, part, parts, strict=True):
                yield from self._read(fs, uri, path, one, of)

    def _read(self, fs: pafs.FileSystem, uri: str, path: str, part: int, parts: int) -> Iterator[pa.RecordBatch]:
        with fs.open_input_file(path) as source:
            file = pq.ParquetFile(source)
            groups = list(range(part, file.num_row_groups, parts))
            present = set(file.schema_arrow.names)
            columns = [name for name in self.schema.names if name in present]
            for batch in file.iter_batches(row_groups=groups, columns=columns):
                yield self._conformed(batch, uri)

    def _conformed(self, batch: pa.RecordBatch, uri: str) -> pa.RecordBatch:
        """`batch` with exactly the schema's columns, in its order and types (absent ones null)."""
        arrays = [batch.column(field.name).cast(field.type) if field.name in batch.schema.names
                  else pa.nulls(batch.num_rows, field.type) for field in self.schema]
        fields = list(self.schema)
        if self.file_column is not None:
            arrays.append(pa.array([uri] * batch.num_rows, pa.string()))
            fields.append(pa.field(self.file_column, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
