"""One writer per queue, whatever starts it (SPEC section 6, step 0): a lease in the lake that a
second starter waits for, then fails naming; that expires when its holder dies; that a cycle
killed with kill -9 leaves to the next starter, who recovers the cycle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
import yaml
from deltalake import write_deltalake

from poison_pipeline import cli
from poison_pipeline.domain.declaration import Declaration, LeaseSettings, load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage import schemas
from poison_pipeline.storage.lease import LEASE_TABLE, Holder, Lease, LeaseHeld, LeaseLost
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import Fenced, queue_writer, queue_writers
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.s3_support import fresh_root
from poison_pipeline_tests.support import places

QUICK = LeaseSettings(wait="300ms", expiry="600ms")


def write_config(folder: Path, wait: str, expiry: str, master: str = SPARK.master,
                 store: dict[str, Any] | None = None) -> Path:
    """`store`: lake_root and storage_options of a lake on the S3 server (default: a folder)."""
    config = folder / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "lake_root": str(folder / "lake"),
        **(store or {}),
        "spark": {**SPARK.model_dump(), "master": master},
        "lease": {"wait": wait, "expiry": expiry},
        "queues": {"q": {"handler": "poison_pipeline_tests.recording_handlers:recording",
                         "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
                                    "receive_error_handling": "drop"}}},
    }))
    return config


def send(declaration: Declaration, count: int, **body: Any) -> None:
    records = [{"message_id": f"m{i:05d}", "message_type": "t", "body": body} for i in range(count)]
    assert not enqueue(declaration, "q", records).refused


def tables(folder: Path, settings: LeaseSettings = QUICK) -> QueueTables:
    return QueueTables(str(folder / "lake"), "q", {}, ("inbound",), settings)


def start_cycle(config: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "poison_pipeline_tests.cycle_process", str(config), "q", "inbound",
                             run_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def from_another_thread(folder: Path, settings: LeaseSettings = QUICK, **options: Any) -> BaseException | None:
    """Take and release the queue's lease in another thread (a thread re-enters a writer it holds)."""
    failure: list[BaseException] = []

    def take() -> None:
        try:
            with queue_writer(tables(folder, settings), "enable", **options):
                pass
        except LeaseHeld as error:
            failure.append(error)

    other = threading.Thread(target=take)
    other.start()
    other.join()
    return failure[0] if failure else None


# -- the lease alone ------------------------------------------------------------------------

def test_a_second_starter_waits_then_fails_naming_the_holder(tmp_path):
    seen: list[Holder] = []
    with queue_writer(tables(tmp_path), "inbound cycle", run_id="run-42"):
        started = time.monotonic()
        error = from_another_thread(tmp_path, on_wait=seen.append)
        waited = time.monotonic() - started
    assert isinstance(error, LeaseHeld)
    message = str(error)
    assert "queue 'q' is busy" in message and "run run-42 (inbound cycle)" in message
    assert f"pid {os.getpid()}" in message and "since 20" in message and "waited" in message
    assert waited >= 0.3
    assert [h.run_id for h in seen] == ["run-42"]


def test_a_second_starter_gets_the_lease_when_the_holder_releases_it(tmp_path):
    patient = tables(tmp_path, LeaseSettings(wait="20s", expiry="2s"))
    order: list[str] = []
    with queue_writer(tables(tmp_path), "inbound cycle", run_id="first"):
        def second() -> None:
            with queue_writer(patient, "enable", run_id="second"):
                order.append("second")

        other = threading.Thread(target=second)
        other.start()
        time.sleep(0.5)
        order.append("first done")
    other.join()
    assert order == ["first done", "second"]


def test_a_holder_that_hands_its_writer_down_gets_it_back_and_one_that_does_not_waits(tmp_path):
    with queue_writer(tables(tmp_path), "inbound cycle") as outer:
        with queue_writer(tables(tmp_path), "end-conversation", within=outer) as inner:
            assert inner is outer
        # Taken under the first, another queue's writer joins the holding: a call handed either finds both.
        with queue_writer(tables(tmp_path / "other"), "end-conversation", within=outer) as other, \
                queue_writer(tables(tmp_path), "transmission", within=other) as again:
            assert again is outer and other.holding is outer.holding
        # Not handed down: the lease is held, even by this very thread.
        with pytest.raises(LeaseHeld), queue_writer(tables(tmp_path, LeaseSettings(wait="300ms", expiry="10s")),
                                                    "enable"):
            pass


def test_two_holders_that_need_the_same_two_queues_take_them_in_one_order_and_both_go_through(tmp_path):
    patient = LeaseSettings(wait="20s", expiry="10s")
    a, b = (QueueTables(str(tmp_path / "lake"), name, {}, ("inbound",), patient) for name in ("a", "b"))
    start, done = threading.Barrier(2), []

    def hold(queues: list[QueueTables]) -> None:
        start.wait()
        # Asked in opposite orders: taken as asked, each would hold one and wait for the other.
        with queue_writers(queues, "end-conversation") as first:
            assert {w.tables.queue for w in first.holding.values()} == {"a", "b"}
            time.sleep(0.3)
            done.append(first.tables.queue)

    holders = [threading.Thread(target=hold, args=(order,)) for order in ([a, b], [b, a])]
    for holder in holders:
        holder.start()
    for holder in holders:
        holder.join()
    assert done == ["a", "a"]  # both took `a` first, one after the other


def test_a_lease_that_is_not_renewed_expires_and_its_holder_learns_it_lost_it(tmp_path):
    queue = tables(tmp_path)
    lease = Lease(queue.uri(LEASE_TABLE), "q", {}, QUICK, "inbound cycle", "frozen")
    lease.acquire()
    # A process paused (or killed) stops renewing: stop the renewal thread without releasing.
    lease._stop.set()
    lease._renewer.join()
    started = time.monotonic()
    with queue_writer(tables(tmp_path, LeaseSettings(wait="10s", expiry="600ms")), "inbound cycle", run_id="next"):
        took = time.monotonic() - started
        lease.renew()
        with pytest.raises(LeaseLost, match="taken over by run next"):
            lease.check()
    assert 0.5 <= took < 5


def test_renewals_keep_a_long_holder_s_lease(tmp_path):
    with queue_writer(tables(tmp_path), "inbound cycle", run_id="long") as writer:
        lease = writer.lease
        time.sleep(2.0)  # more than three expiries of 600ms
        lease.check()
        assert isinstance(from_another_thread(tmp_path), LeaseHeld)
        assert tables(tmp_path).lease_holder().run_id == "long"
    assert from_another_thread(tmp_path) is None
    assert tables(tmp_path).lease_holder() is None


@pytest.mark.parametrize("released_by", ["this version", "an older version (no row left)"])
def test_two_starters_that_see_the_released_lease_at_the_same_moment_never_both_take_it(tmp_path, monkeypatch,
                                                                                       released_by):
    # Found by the soak: two scripts waiting for a cycle both took the lease it released, and both
    # delivered the same messages. Here both read the released lease before either writes.
    with queue_writer(tables(tmp_path), "inbound cycle", run_id="first"):
        pass
    if released_by != "this version":
        write_deltalake(tables(tmp_path).uri(LEASE_TABLE), pa.Table.from_pylist([], schema=schemas.LEASE),
                        mode="overwrite")
    both_read = threading.Barrier(2, timeout=10)
    opened = Lease._open

    def open_together(self: Lease):
        snapshot = opened(self)
        if not getattr(self, "_met", False):
            self._met = True
            both_read.wait()
        return snapshot

    monkeypatch.setattr(Lease, "_open", open_together)
    inside: list[str] = []
    outcomes: dict[str, object] = {}

    def start(name: str) -> None:
        try:
            with queue_writer(tables(tmp_path, LeaseSettings(wait="1s", expiry="30s")), "inbound cycle", run_id=name):
                inside.append(name)
                time.sleep(2.0)  # longer than the other's wait: it must not get in meanwhile
                outcomes[name] = "held"
        except LeaseHeld as error:
            outcomes[name] = error

    starters = [threading.Thread(target=start, args=(name,)) for name in ("a", "b")]
    for thread in starters:
        thread.start()
    for thread in starters:
        thread.join()
    assert len(inside) == 1, f"both starters took the lease: {outcomes}"
    [loser] = [name for name in ("a", "b") if name not in inside]
    assert isinstance(outcomes[loser], LeaseHeld) and f"run {inside[0]}" in str(outcomes[loser])


# -- cycles, processes and commands ---------------------------------------------------------

@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """Where the lake of a multi-process test lives: a folder, or the S3 server."""
    if request.param == "local":
        return None
    return {"lake_root": fresh_root("lease"), "storage_options": request.getfixturevalue("s3_server")}


@pytest.mark.e2e
def test_two_processes_started_together_never_run_a_handler_twice(tmp_path, store):
    config = write_config(tmp_path, wait="5m", expiry="30s", master="local[1]", store=store)
    declaration = load_declaration(config)
    log = tmp_path / "calls.jsonl"
    send(declaration, 2000, log=str(log))
    first, second = start_cycle(config, "run-a"), start_cycle(config, "run-b")
    outputs = [process.communicate(timeout=600) for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    calls = Counter(line["id"] for line in read_lines(log))
    assert len(calls) == 2000 and max(calls.values()) == 1, calls.most_common(3)
    assert all(where == ["processed:processed"] for where in places(declaration).values())


@pytest.mark.e2e
def test_a_holder_killed_with_kill_9_loses_the_lease_and_the_next_starter_recovers_the_cycle(spark, tmp_path,
                                                                                            store):
    config = write_config(tmp_path, wait="2m", expiry="3s", master="local[1]", store=store)
    declaration = load_declaration(config)
    gate, log = tmp_path / "gate", tmp_path / "calls.jsonl"
    gate.touch()
    send(declaration, 20, log=str(log), hold_while=str(gate))
    holder = start_cycle(config, "doomed")
    wait_for(lambda: log.exists())  # a handler is running: the cycle holds the lease and has planned
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    gate.unlink()
    waited_for: list[Holder] = []
    report = run_cycle(spark, declaration, "q", "inbound", run_id="rescuer", on_wait=waited_for.append)
    assert [h.run_id for h in waited_for] == ["doomed"] and waited_for[0].pid == holder.pid
    assert report.counts["processed"] == 20
    assert all(where == ["processed:processed"] for where in places(declaration).values())
    assert len(places(declaration)) == 20


@pytest.mark.e2e
def test_a_command_against_a_running_cycle_waits_then_fails_naming_it_and_works_after(spark, tmp_path, capsys):
    config = write_config(tmp_path, wait="1s", expiry="3s")
    declaration = load_declaration(config)
    gate, log = tmp_path / "gate", tmp_path / "calls.jsonl"
    gate.touch()
    send(declaration, 4, log=str(log), hold_while=str(gate))
    reports: list[Any] = []
    cycle = threading.Thread(target=lambda: reports.append(
        run_cycle(spark, declaration, "q", "inbound", run_id="busy-cycle")))
    cycle.start()
    try:
        wait_for(lambda: log.exists())
        code = cli.main(["--config", str(config), "enable", "q", "--reason", "test"])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BUSY
        assert "run busy-cycle (inbound cycle)" in err and f"pid {os.getpid()}" in err
        assert cli.main(["--config", str(config), "status"]) == cli.EXIT_OK
        assert "busy: lease held by run busy-cycle (inbound cycle)" in capsys.readouterr().out
    finally:
        gate.unlink()
        cycle.join()
    assert reports[0].counts["processed"] == 4
    assert cli.main(["--config", str(config), "enable", "q", "--reason", "test"]) == cli.EXIT_OK


def test_a_writer_that_lost_its_lease_commits_nothing_more(tmp_path):
    """Operator commands too (not only cycles): every commit to a queue's tables goes through the
    writer of its lease, fenced by the lease's epoch, so a command paused past the expiry stops
    instead of writing: refused by its own check, and by the storage where it paused past that."""
    queue = tables(tmp_path)
    queue.ensure()
    row = pa.Table.from_pylist([], schema=schemas.MESSAGE)
    with queue_writer(queue, "redrive", run_id="paused") as writer:
        lease = writer.lease
        lease._stop.set()  # paused: the renewals stop
        lease._renewer.join()
        # The waiter takes the lease once it watched it unrenewed for lease.expiry on its own clock
        # (never at once by the holder's stamp), fencing the paused holder out of every table.
        patient = LeaseSettings(wait="10s", expiry=QUICK.expiry)
        assert from_another_thread(tmp_path, patient, run_id="next") is None  # took the lease, released it
        before = {name: queue.open(name).version() for name in ("inbound", "journal", "actions")}
        with pytest.raises(LeaseLost, match="this run \\(paused\\) stops before committing"):
            writer.replace_batches("inbound", ["b1"], keep=pads.field("message_id").is_valid())
        with pytest.raises(LeaseLost, match="this run \\(paused\\) stops before committing"):
            writer.check()
        # A holder paused between its check and its commit: the storage refuses it all the same.
        lease._lost, lease._renewed = None, time.monotonic()
        writer.check()
        with pytest.raises(Fenced, match="the lease of queue 'q' was taken over"):
            writer.append("inbound", row)
        with pytest.raises(Fenced):
            writer.replace_batches("inbound", ["b1"], keep=pads.field("message_id").is_valid())
        with pytest.raises(Fenced):
            writer.overwrite_where("actions", pa.Table.from_pylist([], schema=schemas.ACTIONS), "action_id = 'x'",
                                   "recording an action")
        assert {name: queue.open(name).version() for name in before} == before
