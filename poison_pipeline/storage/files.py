"""Reading a few columns of the data files a Delta log lists, with pyarrow alone.

Checks and sensors read one narrow column of thousands of small files (a queue filled by many small
enqueues between maintenance runs). delta-rs's own dataset would first turn every file's statistics
into a partition expression, and its Python file system handler takes the GIL for every read; a
local lake is read with pyarrow's native file system instead, on pyarrow's threads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler


def local_root(uri: str) -> str | None:
    """The folder of a table on this machine's disk; None for an object store."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    # A one-letter scheme is a Windows drive, not a store.
    return uri if len(parsed.scheme) <= 1 else None


def files_dataset(uri: str, storage_options: dict[str, str], paths: Sequence[str], sizes: Sequence[int] | None,
                  schema: pa.Schema) -> pads.Dataset:
    """The files `paths` (relative to the table at `uri`, as its log names them) as one dataset of
    `schema`: no file is opened before it is read, and columns missing from a file read as nulls.
    `sizes` (as the log gives them) spare an object store a request per file; `__filename` of a
    row is absolute on a local lake (see `log_names`)."""
    local = local_root(uri)
    if local is not None:
        return pads.dataset([os.path.join(local, p) for p in paths], schema=schema, format="parquet",
                            filesystem=pafs.LocalFileSystem())
    known = dict(zip(paths, sizes, strict=True)) if sizes is not None else None
    handler = DeltaStorageHandler(uri, storage_options, known)
    return pads.dataset(list(paths), schema=schema, format="parquet", filesystem=pafs.PyFileSystem(handler))


def rows_where_in(uri: str, storage_options: dict[str, str], target: DeltaTable, column: str,
                  values: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of the table whose `column` is one of `values` (short strings), with the columns of
    `schema`: only files whose log statistics may hold one of them are opened, so a lookup in a
    table of thousands of one-commit files reads none or a few. A file without statistics is read."""
    actions = files_where_in(target, column, values)
    if actions.num_rows == 0:
        return schema.empty_table()
    dataset = files_dataset(uri, storage_options, actions["path"].to_pylist(), actions["size_bytes"].to_pylist(),
                            schema)
    return dataset.to_table(filter=pc.field(column).isin(list(values)))


def files_where_in(target: DeltaTable, column: str, values: Sequence[str]) -> pa.Table:
    """The add actions (flattened) of the files whose log statistics may hold one of `values` in
    `column`; a file without statistics may."""
    actions = pa.table(target.get_add_actions(flatten=True))
    low, high = f"min.{column}", f"max.{column}"
    if actions.num_rows == 0 or low not in actions.column_names or high not in actions.column_names:
        return actions
    mask = pc.or_(pc.is_null(actions[low]), pc.is_null(actions[high]))
    for value in values:
        mask = pc.or_(mask, pc.and_(pc.less_equal(actions[low], value), pc.greater_equal(actions[high], value)))
    return actions.filter(mask)


def log_names(filenames: Sequence[str], paths: Sequence[str]) -> list[str]:
    """`__filename` values of a `files_dataset(paths)` read, as the log names them (`paths`),
    whatever form the file system gave: Delta names every data file uniquely."""
    names = {os.path.basename(p): p for p in paths}
    return [names[os.path.basename(f)] for f in filenames]
