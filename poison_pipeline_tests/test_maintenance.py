"""Maintenance compacts a queue fed by many small enqueues without changing what a cycle or an
undo sees afterwards."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from dagster import DagsterInstance, DefaultScheduleStatus
from deltalake import DeltaTable, write_deltalake

from poison_pipeline.cli import main
from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import maintenance_schedule_name
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.archive import ArchiveRequest, RestoreRequest, archive, restore
from poison_pipeline.operations.checks import check_conservation
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.maintenance import RetentionTooShort, maintain, retention_hours
from poison_pipeline.operations.purge import purge_table
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage.tables import QueueTables, whole_file_removes
from poison_pipeline.storage.writer import QueueWriter, queue_writer
from poison_pipeline_tests.dagster_support import QUIET
from poison_pipeline_tests.support import places, queue, rows, send

POLICY = {"receive_retry_count": 0, "max_retry_cycles": 1, "retry_cycle_delay": 0, "receive_error_handling": "move"}


def test_after_maintenance_a_cycle_takes_every_small_batch_once_and_an_undo_still_reads_old_versions(
        spark, make_declaration):
    declaration = make_declaration(queue(**POLICY))
    tables = QueueTables.of(declaration, "q")
    send(declaration, {"p": {"fail": True}, "ok": {}})
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "retry_1")
    assert places(declaration)["p"] == ["poison"]
    purged = purge_table(declaration, "q", "poison", 0)
    assert purged.purged == 1
    for b in range(20):
        send(declaration, {f"m{b}-{i}": {} for i in range(3)})
    assert tables.stats("inbound", purged.cutoff).files == 20
    _removed_hours_ago(declaration.lake_root, 2)

    result = maintain(declaration, "q", retention=timedelta(hours=1))

    by_table = {t.table: t for t in result.tables}
    assert by_table["inbound"].files_after == 1 and by_table["intake"].files_after == 1
    assert sum(t.vacuumed_files for t in result.tables) > 0
    # The purge's versions kept their files: its undo brings the message back from time travel.
    assert undo_action(declaration, purged.purge_id).restored == 1
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["messages"] == 60 and rows(declaration, "inbound") == []
    where = places(declaration)
    assert all(where[f"m{b}-{i}"] == ["processed:processed"] for b in range(20) for i in range(3))
    assert check_conservation(tables).passed


def test_the_versions_an_undo_of_a_restore_reads_outlive_the_vacuum(spark, make_declaration):
    """An archive and its restore, then maintenance an hour later: the undo of the restore still
    reads the `archived` table as it was before it, and the queue's cycles go on."""
    declaration = make_declaration(queue(**{**POLICY, "max_retry_cycles": 0}))
    tables = QueueTables.of(declaration, "q")
    send(declaration, {f"p{i}": {"fail": True} for i in range(3)})
    run_cycle(spark, declaration, "q", "inbound")
    assert archive(declaration, ArchiveRequest(queue="q", table="poison", id="a1")).count == 3
    assert restore(declaration, RestoreRequest(queue="q", table="poison", id="r1")).count == 3
    _removed_hours_ago(declaration.lake_root, 3)

    result = maintain(declaration, "q", retention=timedelta(hours=1))

    assert {t.table: t for t in result.tables}["archived"].vacuumed_files == 0
    assert undo_action(declaration, "r1").restored == 3
    assert conservation(tables).archived == 3
    send(declaration, {"ok": {}})
    assert run_cycle(spark, declaration, "q", "inbound").counts["processed"] == 1
    assert check_conservation(tables).passed


def _removed_hours_ago(lake_root: str, hours: int) -> None:
    """Date every file removal in the lake's logs `hours` back: delta-rs's vacuum goes by each
    remove's deletionTimestamp, and a test cannot wait hours for one to age."""
    then = int((time.time() - hours * 3600) * 1000)
    for log in Path(lake_root).glob("*/*/_delta_log/*.json"):
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        for action in lines:
            if "remove" in action:
                action["remove"]["deletionTimestamp"] = then
        log.write_text("".join(json.dumps(action) + "\n" for action in lines))


def test_a_retention_under_an_hour_vacuums_an_hour_and_time_travel_a_minute_back_works(
        tmp_path: Path, capsys) -> None:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": queue(**POLICY)}))
    declaration = load_declaration(config)
    for b in range(3):
        send(declaration, {f"m{b}": {}})
    inbound = QueueTables.of(declaration, "q").uri("inbound")
    before = DeltaTable(inbound).version()
    assert main(["--config", str(config), "maintain", "q", "--retention", "30m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["retention_hours"] == 1
    assert sum(t["vacuumed_files"] for t in out["tables"]) == 0  # every removal is seconds old
    # The version before compaction, written a moment ago, still reads: its files were kept.
    assert DeltaTable(inbound, version=before).to_pyarrow_table().num_rows == 3


@pytest.mark.parametrize("retention", ["0", "30s", "59s"])
def test_a_retention_shorter_than_the_lease_expiry_is_refused_and_nothing_is_done(
        tmp_path: Path, capsys, retention: str) -> None:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": queue(**POLICY)}))  # lease.expiry 1m
    declaration = load_declaration(config)
    for b in range(3):
        send(declaration, {f"m{b}": {}})
    inbound = QueueTables.of(declaration, "q").uri("inbound")
    before = (DeltaTable(inbound).version(), len(DeltaTable(inbound).file_uris()))
    assert main(["--config", str(config), "maintain", "q", "--retention", retention]) == 2
    err = capsys.readouterr().err
    assert "is shorter than the queue's lease expiry (60s)" in err and "Traceback" not in err
    assert (DeltaTable(inbound).version(), len(DeltaTable(inbound).file_uris())) == before
    with pytest.raises(RetentionTooShort):
        maintain(declaration, "q", retention=timedelta(seconds=59))
    assert maintain(declaration, "q", retention=timedelta(0), vacuum=False).retention_hours is None


def test_a_waiting_table_with_rows_not_yet_due_is_not_compacted(spark, make_declaration):
    declaration = make_declaration(queue(**{**POLICY, "retry_cycle_delay": "1h"}))
    for b in range(3):
        send(declaration, {f"r{b}": {"fail_until_cycle": 1}})
        run_cycle(spark, declaration, "q", "inbound")
    before = QueueTables.of(declaration, "q").open("retry_1").file_uris()
    by_table = {t.table: t for t in maintain(declaration, "q").tables}
    assert by_table["retry_1"].files_after == by_table["retry_1"].files_before == len(before) == 3


def test_a_table_whose_cycle_was_interrupted_is_left_for_the_cycle_that_recovers_it(spark, make_declaration,
                                                                                   monkeypatch):
    declaration = make_declaration(queue(**POLICY))
    tables = QueueTables.of(declaration, "q")
    for b in range(3):
        send(declaration, {f"a{b}": {}})
    append = QueueWriter.append

    def killed_at_processed(self: QueueWriter, table: str, *args: Any, **kwargs: Any) -> bool:
        if table == "processed":
            raise RuntimeError("killed while committing the processed ledger")
        return append(self, table, *args, **kwargs)

    monkeypatch.setattr(QueueWriter, "append", killed_at_processed)
    with pytest.raises(RuntimeError, match="killed"):
        run_cycle(spark, declaration, "q", "inbound")
    monkeypatch.undo()
    for b in range(3):
        send(declaration, {f"b{b}": {}})
    files = tables.open("inbound").file_uris()
    _removed_hours_ago(declaration.lake_root, 2)

    by_table = {t.table: t for t in maintain(declaration, "q", retention=timedelta(hours=1)).tables}

    assert "staged cycle 1 awaits recovery" in (by_table["inbound"].skipped or "")
    assert by_table["intake"].files_after == 1 and by_table["intake"].skipped is None
    assert tables.open("inbound").file_uris() == files
    assert all(os.path.exists(f.removeprefix("file://")) for f in files)
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.recovered is not None and report.recovered["processed"] == 3
    assert report.counts["processed"] == 3
    where = places(declaration)
    assert sorted(where) == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert all(found == ["processed:processed"] for found in where.values())
    assert check_conservation(tables).passed


def test_taken_batches_leave_whether_they_have_files_of_their_own_or_share_a_compacted_one(make_declaration):
    declaration = make_declaration(queue(**POLICY))
    tables = QueueTables.of(declaration, "q")
    for b in range(4):
        send(declaration, {f"m{b}-{i}": {} for i in range(2)})

    def batches() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for row in rows(declaration, "inbound"):
            found.setdefault(row["batch_id"], []).append(row["message_id"])
        return {batch: sorted(ids) for batch, ids in found.items()}

    by_id = {ids[0]: batch for batch, ids in batches().items()}
    with queue_writer(tables, "test") as writer:
        writer.remove_batches("inbound", [by_id["m0-0"]])
    maintain(declaration, "q", vacuum=False)
    assert len(tables.open("inbound").file_uris()) == 1
    with queue_writer(tables, "test") as writer:
        writer.remove_batches("inbound", [by_id["m1-0"], "never-enqueued"])  # part of the compacted file
        assert sorted(batches().values()) == [["m2-0", "m2-1"], ["m3-0", "m3-1"]]
        writer.remove_batches("inbound", [by_id["m2-0"], by_id["m3-0"]])  # all of it
        writer.remove_batches("inbound", [by_id["m2-0"]])  # again: nothing changes
    assert batches() == {} and tables.open("inbound").file_uris() == []


def test_a_file_holding_rows_of_no_batch_beside_a_taken_one_is_not_dropped_whole(tmp_path) -> None:
    # Statistics skip nulls: such a file's min and max batch id are both the taken batch's.
    write_deltalake(str(tmp_path / "t"), pa.table({"batch_id": ["x", None, "x"], "v": [1, 2, 3]}))
    target = DeltaTable(str(tmp_path / "t"))
    read = lambda paths: pa.table({"batch_id": ["x", None, "x"], "file": [0, 0, 0]})  # noqa: E731
    assert whole_file_removes(target, pa.array(["x"]), read) is None  # delta-rs's delete rewrites it
    assert whole_file_removes(target, pa.array(["y"]), read) == []


def test_maintain_from_the_command_line(tmp_path: Path, capsys) -> None:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": queue(**POLICY)}))
    declaration = load_declaration(config)
    for b in range(3):
        send(declaration, {f"m{b}": {}})
    assert main(["--config", str(config), "maintain", "q", "--no-vacuum", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    inbound = next(t for t in out["tables"] if t["table"] == "inbound")
    assert (out["retention_hours"], inbound["files_before"], inbound["files_after"]) == (None, 3, 1)
    assert main(["--config", str(config), "maintain", "q", "--retention", "soon"]) == 2
    assert "'soon' is not a duration" in capsys.readouterr().err


def test_the_retention_rounds_up_to_whole_hours() -> None:
    assert [retention_hours(timedelta(minutes=m)) for m in (1, 30, 60, 61, 90, 24 * 60)] == [1, 1, 1, 2, 2, 24]


def test_the_maintenance_job_compacts_and_its_daily_schedule_starts_stopped(make_declaration) -> None:
    declaration = make_declaration(queue(**POLICY))
    for b in range(3):
        send(declaration, {f"m{b}": {}})
    defs = build_definitions(declaration)
    schedule = {s.name: s for s in defs.get_repository_def().schedule_defs}[maintenance_schedule_name("q")]
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(schedule.job_name).execute_in_process(instance=instance, run_config=QUIET)
    assert result.success
    assert len(QueueTables.of(declaration, "q").open("inbound").file_uris()) == 1
