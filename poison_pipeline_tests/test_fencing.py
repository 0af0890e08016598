"""A lease is not a fence: a holder paused for any time between its check and its write must find
its commit refused by the storage once another starter took the lease over (storage/writer.py), and
a delivering process resumed from a pause stops before its next attempt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import yaml
from deltalake import DeltaTable

from poison_pipeline.domain.declaration import Declaration, LeaseSettings, load_declaration
from poison_pipeline.engine import cycle as cycle_module
from poison_pipeline.engine.commit import SequenceReused
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage import schemas
from poison_pipeline.storage.intake import accepted_total
from poison_pipeline.storage.journal import JournalEntry, read_entry, write_entry
from poison_pipeline.storage.lease import LEASE_TABLE, Lease, LeaseGuard, LeaseHeld
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Fenced, QueueWriter, fence_app, queue_writer
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import places

QUICK = LeaseSettings(wait="20s", expiry="800ms")
ROOT = Path(__file__).resolve().parents[1]


def _no_spark() -> Any:
    raise AssertionError("small cycles only")


class _Stale(QueueTables):
    """The queue's tables as a paused holder saw them: every open returns the snapshot it read
    before the pause, so its commits go to Delta's conflict checker."""

    def open(self, table: str) -> DeltaTable:
        return self._seen[table]  # type: ignore[attr-defined]


def _message(message_id: str, batch: str) -> pa.Table:
    return pa.Table.from_pylist([{"message_id": message_id, "batch_id": batch, "body": b"{}",
                                  "message_type": "t", "abort_count": 0, "move_count": 0}], schema=schemas.MESSAGE)


def _paused_holder(tables: QueueTables, snapshots: bool) -> QueueWriter:
    """A holder of the lease whose renewals stopped (its process froze) and whose own check passes
    (it froze right after making it); with `snapshots`, it read every table before freezing."""
    lease = Lease(tables.uri(LEASE_TABLE), tables.queue, tables.storage_options, QUICK, "paused", "paused")
    lease.acquire()
    lease._stop.set()  # the renewer froze with its process
    lease.check = lambda: None  # type: ignore[method-assign]
    if not snapshots:
        return QueueWriter(tables, lease)
    stale = _Stale(tables.lake_root, tables.queue, tables.storage_options, tables.waiting, QUICK)
    object.__setattr__(stale, "_seen", {t: tables.open(t) for t in (*tables.all_tables,)})
    return QueueWriter(stale, lease)


COMMITS: dict[str, Callable[[QueueWriter], None]] = {
    "append": lambda w: w.append("inbound", _message("late", "late-batch")),
    "append once": lambda w: w.append("processed", schemas.PROCESSED.empty_table(), app_id="x", version=1),
    "remove batches": lambda w: w.remove_batches("inbound", ["b1"]),
    "replace batches": lambda w: w.replace_batches("inbound", ["b1"], keep=pads.field("message_id") == "none"),
    "overwrite where": lambda w: w.overwrite_where("inbound", _message("m1", "b1"), "batch_id = 'b1'", "rewriting"),
    "restore": lambda w: w.restore("inbound", 0, w.tables.open("inbound")),
    "journal": lambda w: write_entry(w, JournalEntry(7, "planned", "inbound", "paused", "2026-01-01T00:00:00+00:00")),
}


@pytest.mark.parametrize("snapshots", [False, True], ids=["read after the takeover", "read before it"])
@pytest.mark.parametrize("kind", sorted(COMMITS))
def test_a_holder_paused_past_its_lease_cannot_commit_once_another_took_it(
        make_any_declaration: Callable[..., Declaration], kind: str, snapshots: bool) -> None:
    declaration = make_any_declaration({"q": {"handler": "poison_pipeline_tests.handlers:accept"}},
                                   lease={"wait": "20s", "expiry": "800ms"})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    with queue_writer(tables, "seed") as seed:
        seed.append("inbound", _message("m1", "b1"))
    paused = _paused_holder(tables, snapshots)
    versions = {t: tables.open(t).version() for t in tables.all_tables}
    with queue_writer(tables, "next holder") as taker:
        assert taker.lease.took_over and taker.epoch == paused.epoch + 1
    fenced = {t: tables.open(t).version() for t in tables.all_tables}
    assert all(fenced[t] == versions[t] + 1 for t in tables.all_tables)  # one fence commit each
    with pytest.raises(Fenced, match="taken over"):
        COMMITS[kind](paused)
    assert {t: tables.open(t).version() for t in tables.all_tables} == fenced  # nothing landed
    assert [r["message_id"] for r in tables.open("inbound").to_pyarrow_table().to_pylist()] == ["m1"]
    assert tables.open("inbound").transaction_version(fence_app("q")) == taker.epoch


def test_a_released_lease_is_taken_at_once_and_needs_no_fence(make_declaration: Callable[..., Declaration]) -> None:
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:accept"}},
                                   lease={"wait": "20s", "expiry": "800ms"})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    with queue_writer(tables, "first") as first:
        first.append("inbound", _message("m1", "b1"))
    before = tables.open("inbound").version()
    started = time.monotonic()
    with queue_writer(tables, "second") as second:
        assert not second.lease.took_over and second.epoch == first.epoch + 1
        second.append("inbound", _message("m2", "b2"))
    assert time.monotonic() - started < 0.8  # no expiry waited
    assert tables.open("inbound").version() == before + 1  # its append only: no fence commit
    assert tables.open("inbound").transaction_version(fence_app("q")) == second.epoch


def test_a_waiter_never_takes_a_renewed_lease_whatever_the_stamps_say(
        make_declaration: Callable[..., Declaration]) -> None:
    """The holder's stamps are another host's clock: a waiter whose clock runs far ahead (or the
    holder's behind) must still wait for the row to stop changing."""
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:accept"}},
                                   lease={"wait": "2s", "expiry": "800ms"})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    uri = tables.uri(LEASE_TABLE)
    holder = Lease(uri, "q", {}, LeaseSettings(wait="2s", expiry="800ms"), "cycle", "holder")
    holder.acquire()
    ancient = holder._row
    # Every row the holder writes says it expired an hour ago.
    holder._row = lambda: {**ancient(), "renewed_at": ancient()["renewed_at"].replace(year=2000),  # type: ignore[method-assign]
                           "expires_at": ancient()["expires_at"].replace(year=2000)}
    holder.renew()
    try:
        waiter = Lease(uri, "q", {}, LeaseSettings(wait="2s", expiry="800ms"), "cycle", "waiter")
        with pytest.raises(LeaseHeld):
            waiter.acquire()
    finally:
        holder.release()


# --- whole cycles paused at every commit point, and in the middle of a delivery -------------------


def _config(folder: Path) -> Path:
    config = folder / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "lake_root": str(folder / "lake"),
        "lease": {"wait": "30s", "expiry": "1s"},
        "small_cycles": {"max_messages": 1000},
        "queues": {"q": {"handler": "poison_pipeline_tests.pausing_cycle:paused_handler",
                         "policy": {"receive_retry_count": 0, "max_retry_cycles": 0,
                                    "receive_error_handling": "move"}}},
    }))
    return config


def _start(config: Path, stop_at: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "poison_pipeline_tests.pausing_cycle", str(config), "q",
                             "inbound", str(stop_at)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_stopped(process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the cycle ended without stopping: {process.stdout.read()}")  # type: ignore[union-attr]
        with open(f"/proc/{process.pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] == "T":
                return
        time.sleep(0.05)
    raise AssertionError("the cycle never stopped")


def _resume(process: subprocess.Popen[str]) -> str:
    os.killpg(process.pid, signal.SIGCONT)
    output, _ = process.communicate(timeout=120)
    return output


def _body(log: Path, pause: Path | None = None) -> dict[str, Any]:
    return {"log": str(log), **({"pause_once": str(pause)} if pause else {})}


def _settled(declaration: Declaration, expected: set[str]) -> None:
    """Every message processed exactly once, nowhere else, and the queue's books balance."""
    found = places(declaration)
    assert found == {m: ["processed:processed"] for m in expected}, found
    tables = QueueTables.of(declaration, "q")
    assert conservation(tables).line(accepted_total(tables)).endswith("OK")


# The writes of a small cycle that processes everything: journal planned, attempts, processed,
# the removal from inbound, journal done.
CYCLE_WRITES = 5


@pytest.mark.e2e
@pytest.mark.parametrize("stop_at", range(1, CYCLE_WRITES + 1))
def test_a_cycle_paused_at_any_commit_point_is_fenced_out_and_nothing_is_lost(tmp_path: Path, stop_at: int) -> None:
    config = _config(tmp_path)
    declaration = load_declaration(config)
    log = tmp_path / "deliveries.jsonl"
    first = [{"message_id": f"m{i}", "message_type": "t", "body": _body(log)} for i in range(3)]
    assert enqueue(declaration, "q", first).accepted == 3
    paused = _start(config, stop_at)
    try:
        _wait_stopped(paused)
        taken = run_cycle(_no_spark, declaration, "q", "inbound", run_id="next")
        assert taken.counts.get("processed") == 3 or (taken.recovered or {}).get("processed") == 3
        later = [{"message_id": f"n{i}", "message_type": "t", "body": _body(log)} for i in range(2)]
        assert enqueue(declaration, "q", later).accepted == 2
    finally:
        output = _resume(paused)
    assert "COMMITTED" not in output and ("Fenced" in output or "LeaseLost" in output), output
    run_cycle(_no_spark, declaration, "q", "inbound", run_id="after")
    _settled(declaration, {"m0", "m1", "m2", "n0", "n1"})
    journal = read_entry(QueueTables.of(declaration, "q"), "inbound")
    assert journal is not None and journal.state == "done"
    calls = [(line["id"], line["pid"]) for line in read_lines(log)]
    assert {m for m, pid in calls if m.startswith("n")} == {"n0", "n1"}
    assert len([m for m, _ in calls if m.startswith("n")]) == 2  # the new messages: delivered once


@pytest.mark.e2e
def test_a_cycle_paused_in_a_delivery_makes_no_further_attempt_once_resumed(tmp_path: Path) -> None:
    config = _config(tmp_path)
    declaration = load_declaration(config)
    log, pause = tmp_path / "deliveries.jsonl", tmp_path / "pause-once"
    pause.touch()
    messages = [{"message_id": f"m{i}", "message_type": "t", "body": _body(log, pause if i == 1 else None)}
                for i in range(6)]
    assert enqueue(declaration, "q", messages).accepted == 6
    paused = _start(config, 0)
    try:
        _wait_stopped(paused)
        run_cycle(_no_spark, declaration, "q", "inbound", run_id="next")
    finally:
        output = _resume(paused)
    assert "COMMITTED" not in output, output
    _settled(declaration, {f"m{i}" for i in range(6)})
    calls = read_lines(log)
    # The paused process delivered m0 and was in m1's attempt; once resumed it attempted nothing more.
    paused_calls = [line["id"] for line in calls if line["pid"] == calls[0]["pid"]]
    assert paused_calls == ["m0", "m1"], json.dumps(calls)


# --- deliveries on Spark, and a journal behind the tables --------------------------------------------


_GUARD_OF = LeaseGuard.of


def _taken_over_guard(lease: Lease) -> LeaseGuard:
    """The guard of a cycle whose lease another starter has since taken (one epoch on)."""
    guard = _GUARD_OF(lease)
    guard.epoch -= 1
    return guard


@pytest.mark.parametrize("max_messages", [0, 1000], ids=["spark tasks", "small cycle worker"])
def test_a_delivery_whose_lease_was_taken_over_attempts_nothing_and_commits_nothing(
        spark: Any, make_declaration: Callable[..., Declaration], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        max_messages: int) -> None:
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.pausing_cycle:paused_handler"}},
                                   small_cycles={"max_messages": max_messages})
    log = tmp_path / "deliveries.jsonl"
    enqueue(declaration, "q", [{"message_id": f"m{i}", "message_type": "t", "body": _body(log)} for i in range(4)])
    tables = QueueTables.of(declaration, "q")
    before = {t: tables.open(t).version() for t in ("inbound", "processed", "attempts")}
    monkeypatch.setattr(cycle_module.LeaseGuard, "of", _taken_over_guard)
    with pytest.raises(Exception, match="taken over"):
        run_cycle(spark, declaration, "q", "inbound")
    assert read_lines(log) == []  # checked before the first attempt
    assert {t: tables.open(t).version() for t in before} == before
    monkeypatch.undo()
    run_cycle(spark, declaration, "q", "inbound")
    _settled(declaration, {f"m{i}" for i in range(4)})


def test_a_new_cycle_whose_sequence_is_already_committed_stops_and_moves_nothing(
        make_declaration: Callable[..., Declaration], tmp_path: Path) -> None:
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.pausing_cycle:paused_handler"}})
    log = tmp_path / "deliveries.jsonl"
    enqueue(declaration, "q", [{"message_id": "m0", "message_type": "t", "body": _body(log)}])
    run_cycle(_no_spark, declaration, "q", "inbound")
    enqueue(declaration, "q", [{"message_id": "m1", "message_type": "t", "body": _body(log)}])
    tables = QueueTables.of(declaration, "q")
    # The journal rolled back to before cycle 1 (what a holder paused past its lease once could do).
    with queue_writer(tables, "rollback") as writer:
        write_entry(writer, JournalEntry(0, "done", "inbound", "old", "2026-01-01T00:00:00+00:00"))
    with pytest.raises(SequenceReused, match="already has a commit of the inbound cycle 1"):
        run_cycle(_no_spark, declaration, "q", "inbound")
    assert places(declaration) == {"m0": ["processed:processed"], "m1": ["inbound"]}
