"""The plain files under a lake root (intake notes, in-flight markers, staged results) on an object
store and on a local folder: opened with the lake's storage options, written whole or not at all.

The object store is the test run's S3 server (`s3_server`, conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from poison_pipeline.engine import staged
from poison_pipeline.storage.inflight import Marker, culprits, note_timeout, remove_timeout_note
from poison_pipeline.storage.journal import list_files, read_json, remove_file, remove_tree, write_json
from poison_pipeline.storage.uri import fs_of, whole
from poison_pipeline_tests.s3_support import fresh_root


class Lake(NamedTuple):
    root: str
    storage_options: dict[str, str]


@pytest.fixture(params=["s3", "local"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Lake:
    if request.param == "local":
        return Lake(str(tmp_path / "lake"), {})
    options = request.getfixturevalue("s3_server")
    return Lake(fresh_root(), options)  # a lake of its own per test


def _objects(lake: Lake, folder: str) -> list[str]:
    """Every file under `folder` of the lake, hidden ones included, as names relative to it."""
    fs, path = fs_of(f"{lake.root}/{folder}", lake.storage_options)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    return sorted(info.path.removeprefix(path).lstrip("/")
                  for info in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                  if info.type == pafs.FileType.File)


# --- JSON notes -------------------------------------------------------------------------------------


def test_json_notes_are_written_read_listed_and_removed(lake: Lake) -> None:
    folder = f"{lake.root}/q/_work/intake"
    assert list_files(folder, lake.storage_options) == []
    assert read_json(f"{folder}/a.json", lake.storage_options) is None
    write_json(f"{folder}/a.json", lake.storage_options, {"batch_id": "a", "messages": 3}, "noting a")
    write_json(f"{folder}/b.json", lake.storage_options, {"batch_id": "b"}, "noting b")
    write_json(f"{folder}/a.json", lake.storage_options, {"batch_id": "a", "messages": 4}, "noting a again")
    listed = list_files(folder, lake.storage_options)
    assert listed == [f"{folder}/a.json", f"{folder}/b.json"]
    # What the listing names opens again (with the same options).
    assert [read_json(uri, lake.storage_options) for uri in listed] == [{"batch_id": "a", "messages": 4},
                                                                        {"batch_id": "b"}]
    assert _objects(lake, "q/_work/intake") == ["a.json", "b.json"]  # no temporary left behind
    remove_file(listed[0], lake.storage_options)
    remove_file(listed[0], lake.storage_options)  # already gone: nothing to do
    assert list_files(folder, lake.storage_options) == [f"{folder}/b.json"]
    remove_tree(f"{lake.root}/q/_work", lake.storage_options)
    remove_tree(f"{lake.root}/q/_work", lake.storage_options)
    assert list_files(folder, lake.storage_options) == []
    assert _objects(lake, "q") == []


class _Midway(Exception):
    pass


def test_a_write_that_fails_midway_leaves_no_file_and_the_old_one_whole(lake: Lake) -> None:
    uri = f"{lake.root}/q/_work/note.json"
    with pytest.raises(_Midway), whole(uri, lake.storage_options) as stream:
        stream.write(b'{"half": ')
        raise _Midway
    assert read_json(uri, lake.storage_options) is None
    assert _objects(lake, "q") == []
    write_json(uri, lake.storage_options, {"old": True}, "writing the old note")
    with pytest.raises(_Midway), whole(uri, lake.storage_options) as stream:
        stream.write(b'{"new": ')
        raise _Midway
    assert read_json(uri, lake.storage_options) == {"old": True}
    assert _objects(lake, "q/_work") == ["note.json"]


def test_a_large_write_that_fails_after_parts_were_uploaded_leaves_nothing(lake: Lake) -> None:
    """Past delta-rs's 4 MiB buffer an object store has parts uploaded before the write ends."""
    uri = f"{lake.root}/q/_work/staging/big.bin"
    chunk = b"x" * (5 * 1024 * 1024)
    with pytest.raises(_Midway), whole(uri, lake.storage_options) as stream:
        for _ in range(3):
            stream.write(chunk)
        raise _Midway
    assert _objects(lake, "q") == []
    with whole(uri, lake.storage_options) as stream:
        for _ in range(3):
            stream.write(chunk)
    fs, path = fs_of(uri, lake.storage_options)
    assert fs.get_file_info(path).size == 3 * len(chunk)


# --- parquet: a cycle's staged results --------------------------------------------------------------


def _staged_rows(n: int) -> pa.Table:
    rows: list[dict[str, Any]] = [{"message_id": f"m{i}", "destination": "processed"} for i in range(n)]
    return pa.Table.from_pylist(rows, schema=pa.schema([staged.STAGED.field("message_id"),
                                                         staged.STAGED.field("destination")]))


def test_staged_parquet_is_written_whole_and_read_as_a_dataset(lake: Lake) -> None:
    staging = f"{lake.root}/q/_work/staging/inbound/1-holder"
    rows = _staged_rows(10)
    fs, folder = fs_of(staging, lake.storage_options)
    with whole(f"{staging}/{staged.LEDGER_PREFIX}00000.parquet", lake.storage_options) as file:
        pq.write_table(rows, file)
    # A task that fails after writing row groups leaves nothing the dataset would read, though its
    # parquet writer closes (writes its footer) on the way out, as a Spark task's does.
    with (pytest.raises(_Midway), whole(f"{staging}/{staged.MOVED_PREFIX}00000.parquet", lake.storage_options) as file,
          pq.ParquetWriter(file, rows.schema) as writer):
        writer.write_table(rows)
        writer.write_table(rows)
        raise _Midway
    read = staged.dataset(staging, lake.storage_options).to_table(columns=["message_id", "destination"])
    assert sorted(read["message_id"].to_pylist()) == sorted(rows["message_id"].to_pylist())
    assert _objects(lake, "q/_work/staging/inbound/1-holder") == [f"{staged.LEDGER_PREFIX}00000.parquet"]
    assert fs.get_file_info(folder).type.name == "Directory"
    remove_tree(staging, lake.storage_options)
    assert _objects(lake, "q") == []


# --- in-flight markers and timeout notes ------------------------------------------------------------


def test_in_flight_markers_name_their_culprits_and_are_removed(lake: Lake) -> None:
    folder = f"{lake.root}/q/_work/inflight/inbound/holder"
    assert culprits(folder, lake.storage_options) == []
    crashed, hung, done = (Marker(folder, lake.storage_options) for _ in range(3))
    crashed.mark("m1")
    crashed.mark("m2")  # each mark replaces the last
    hung.mark("m3")
    note_timeout(hung.uri, lake.storage_options)
    done.mark("m4")
    note_timeout(done.uri, lake.storage_options)
    remove_timeout_note(done.uri, lake.storage_options)  # the attempt ended before the kill
    remove_timeout_note(done.uri, lake.storage_options)
    done.clear()
    found = sorted(culprits(folder, lake.storage_options))
    assert [(c.message_id, c.timed_out) for c in found] == [("m2", False), ("m3", True)]
    assert _objects(lake, "q") == []
    assert culprits(folder, lake.storage_options) == []



# --- a small cycle on an s3:// lake -----------------------------------------------------------------


def _no_spark() -> Any:
    raise AssertionError("small cycles only: no Spark session may be started")


@pytest.mark.e2e
def test_a_small_cycle_on_an_object_store_lake_processes_everything_and_balances(
        s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from poison_pipeline.domain.declaration import parse_declaration
    from poison_pipeline.operations.conservation import conservation
    from poison_pipeline.operations.cycle import run_cycle
    from poison_pipeline.operations.records import enqueue
    from poison_pipeline.storage import intake
    from poison_pipeline.storage.tables import QueueTables
    from poison_pipeline_tests.support import places

    options = s3_server
    root = fresh_root("cycle-lake")
    declaration = parse_declaration({
        "lake_root": root, "storage_options": options, "small_cycles": {"max_messages": 1000},
        "lease": {"wait": "30s", "expiry": "30s"},
        "queues": {"q": {"handler": "poison_pipeline_tests.handlers:accept",
                         "policy": {"receive_retry_count": 0, "max_retry_cycles": 0}}}})
    tables = QueueTables.of(declaration, "q")
    first = [{"message_id": f"m{i}", "message_type": "t", "body": {}} for i in range(3)]
    assert enqueue(declaration, "q", first).accepted == 3
    # An enqueue whose intake row failed after its batch landed: its note, on the store, is what
    # lets the next cycle record the row.
    real = intake.record_intake
    monkeypatch.setattr(intake, "record_intake", lambda *a, **k: (_ for _ in ()).throw(OSError("intake down")))
    with pytest.raises(OSError, match="intake down"):
        enqueue(declaration, "q", [{"message_id": "late", "message_type": "t", "body": {}}])
    monkeypatch.setattr(intake, "record_intake", real)
    assert len(list_files(tables.work_uri("intake"), options)) == 1
    report = run_cycle(_no_spark, declaration, "q", "inbound", run_id="s3")
    assert report.counts.get("processed") == 4, report
    assert list_files(tables.work_uri("intake"), options) == []
    assert places(declaration) == {m: ["processed:processed"] for m in ("m0", "m1", "m2", "late")}
    assert conservation(tables).line(intake.accepted_total(tables)).endswith("OK")
    assert _objects(Lake(root, options), "q/_work/staging") == []  # the staged results, removed once committed
