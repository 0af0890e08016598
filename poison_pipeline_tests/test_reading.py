"""Lake files as a Spark DataFrame (engine/reading.py): Arrow tasks read what Spark's own reader
reads, on a local folder and on the S3 server, a column a file lacks as nulls, a big file in parts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from poison_pipeline.engine import reading
from poison_pipeline.engine.reading import read_files
from poison_pipeline.storage.uri import fs_of, whole
from poison_pipeline_tests.s3_support import fresh_root

SCHEMA = pa.schema([pa.field("message_id", pa.string()), pa.field("attempt", pa.int32()),
                    pa.field("due_at", pa.timestamp("us", tz="UTC")), pa.field("note", pa.string())])
AT = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _write(uri: str, options: dict[str, str], table: pa.Table, row_group_size: int) -> int:
    with whole(uri, options) as out:
        pq.write_table(table, out, row_group_size=row_group_size)
    fs, path = fs_of(uri, options)
    return int(fs.get_file_info(path).size)


def _files(root: str, options: dict[str, str]) -> tuple[list[str], list[int]]:
    """Two files: one of 10 rows in 4 row groups with every column, one of 3 rows without `note`
    (as a file written before a column was added)."""
    full = pa.table({"message_id": [f"a{i}" for i in range(10)], "attempt": pa.array(range(10), pa.int32()),
                     "due_at": pa.array([AT] * 10, pa.timestamp("us", tz="UTC")),
                     "note": [f"n{i}" for i in range(10)]})
    older = pa.table({"message_id": ["b0", "b1", "b2"], "attempt": pa.array([7, 8, 9], pa.int32()),
                      "due_at": pa.array([AT] * 3, pa.timestamp("us", tz="UTC"))})
    uris = [f"{root}/full.parquet", f"{root}/older.parquet"]
    sizes = [_write(uris[0], options, full, 3), _write(uris[1], options, older, 3)]
    return uris, sizes


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in frame.collect())


# As Spark collects a timestamp: naive, in the session's time zone (UTC).
NAIVE = AT.replace(tzinfo=None)
EXPECTED = sorted([(f"a{i}", i, NAIVE, f"n{i}") for i in range(10)] + [(f"b{i}", 7 + i, NAIVE, None)
                                                                       for i in range(3)])


def test_arrow_tasks_read_what_sparks_reader_reads_on_a_local_folder(spark, tmp_path: Path) -> None:
    uris, sizes = _files(str(tmp_path), {})
    by_spark = read_files(spark, uris, SCHEMA, {}, sizes=sizes)  # a local lake: Spark's own reader
    by_arrow = read_files(spark, uris, SCHEMA, {}, sizes=sizes, arrow=True)
    assert by_arrow.schema == by_spark.schema
    assert _rows(by_spark) == _rows(by_arrow) == EXPECTED


def test_a_big_file_is_read_by_several_tasks_each_row_once(spark, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    uris, sizes = _files(str(tmp_path), {})
    monkeypatch.setattr(reading, "_PART_BYTES", sizes[0] // 3)  # the 4 row groups of `full` in 3 or 4 parts
    frame = read_files(spark, uris, SCHEMA, {}, sizes=sizes, arrow=True)
    assert frame.rdd.getNumPartitions() > 1
    per_task = frame.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
    assert len([n for n in per_task if n]) >= 3
    assert _rows(frame) == EXPECTED


def test_each_row_names_its_file_as_given(spark, tmp_path: Path) -> None:
    uris, sizes = _files(str(tmp_path), {})
    frame = read_files(spark, uris, SCHEMA, {}, sizes=sizes, file_column="file", arrow=True)
    named = {row["message_id"]: row["file"] for row in frame.select("message_id", "file").collect()}
    assert named["a3"] == uris[0] and named["b1"] == uris[1]


@pytest.mark.e2e
def test_on_the_s3_server_the_executors_read_through_arrow(spark, s3_server: dict[str, str]) -> None:
    uris, sizes = _files(fresh_root("reading"), s3_server)
    frame = read_files(spark, uris, SCHEMA, s3_server, sizes=sizes, file_column="file")  # the default there
    assert sorted(row[:4] for row in _rows(frame)) == EXPECTED
    assert {row["file"] for row in frame.select("file").collect()} == set(uris)
