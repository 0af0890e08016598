"""Storage that fails under a commit (issue 11, item 2): a table folder made read-only mid-cycle, a
full disk, and an OSError (ENOSPC, EROFS, EIO) injected at every commit point of a cycle, an
enqueue and a redrive. Each must fail loudly, naming the table (or file) and the OS error, lose
nothing, and the next run must complete the work exactly as a fault-free run does.

The read-only and full-disk cases need a real file system that refuses writes. As root (this
machine, CI) chmod does not stop writes, so they use a read-only bind mount and a tiny tmpfs;
without root, chmod makes a folder read-only and no full disk can be made. Where neither works (a
container without CAP_SYS_ADMIN), the case runs the injected form of the same fault instead, and
its test id says so (`injected-...`): never a skip that hides a missing check.
"""

from __future__ import annotations

import errno
import functools
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterInstance
from deltalake import DeltaTable

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import job_name
from poison_pipeline.domain.declaration import Declaration, parse_declaration
from poison_pipeline.operations.actions import list_actions
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.storage import uri as uri_module
from poison_pipeline.storage import writer as writer_module
from poison_pipeline.storage.faults import StorageFailure
from poison_pipeline.storage.intake import accepted_total, settle_intake
from poison_pipeline.storage.tables import INBOUND, PLANS, QueueTables
from poison_pipeline.storage.writer import LeaseFreeAppender
from poison_pipeline_tests import concurrent_commits as cc
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.dagster_support import QUIET, failure_text
from poison_pipeline_tests.support import at_step, places, rows
from poison_pipeline_tests.test_crash import STEPS, outcome, scenario

# Below the product's own wording (storage/faults.writing): the calls that write to the lake.
LOW_STEPS = ((writer_module, "write_deltalake"), (DeltaTable, "delete"), (DeltaTable, "create_write_transaction"),
             (uri_module, "whole_in"))
# An action's record is written by the queue's writer too (storage/writer.py): no other step.
REDRIVE_STEPS = LOW_STEPS
ERRORS = (errno.ENOSPC, errno.EROFS, errno.EIO)
# What each durable step of the crash test's cycle writes, as the error names it.
CYCLE_TARGETS = ["table journal", "table journal", "table attempts", "table dead_letter",
                 "table processed", "table retry_1", "table events", "table inbound", "table journal"]


def _raise(code: int) -> Callable[[int], None]:
    def fail(step: int) -> None:
        raise OSError(code, os.strerror(code))
    return fail


def _assert_loud(failure: StorageFailure, code: int, where: str) -> None:
    """One paragraph naming the table or file and the OS error."""
    text = str(failure)
    assert failure.errno == code, text
    assert where in text and f"[{errno.errorcode[code]}]" in text and os.strerror(code) in text, text
    assert "\n" not in text and "\x1b" not in text, text


def _balanced(declaration: Declaration, received: int) -> None:
    tables = QueueTables.of(declaration, "q")
    line = conservation(tables)
    assert accepted_total(tables) == received == line.accounted, line.line(accepted_total(tables))


# -- an injected OSError at every commit point --------------------------------------------------


def test_a_cycle_fails_loudly_at_every_commit_point_and_the_next_run_completes_it(spark, tmp_path, monkeypatch):
    baseline = scenario(tmp_path / "baseline")
    run_cycle(spark, baseline, "q", "inbound")
    expected = outcome(baseline)
    for step in range(1, STEPS + 1):
        code = ERRORS[step % len(ERRORS)]
        declaration = scenario(tmp_path / f"fault{step}")
        called = at_step(monkeypatch, LOW_STEPS, step, _raise(code))
        with pytest.raises(StorageFailure) as failed:
            run_cycle(spark, declaration, "q", "inbound")
        monkeypatch.undo()
        assert len(called) == step
        _assert_loud(failed.value, code, CYCLE_TARGETS[step - 1])
        assert "inbound cycle of queue 'q' stopped" in str(failed.value) and "nothing is lost" in str(failed.value)
        run_cycle(spark, declaration, "q", "inbound")
        assert outcome(declaration) == expected, f"after {errno.errorcode[code]} at step {step}"
        _balanced(declaration, 4)
    # The steps counted here are every step of the cycle, as in the crash test.
    declaration = scenario(tmp_path / "census")
    called = at_step(monkeypatch, LOW_STEPS, 0, _raise(errno.EIO))
    run_cycle(spark, declaration, "q", "inbound")
    assert len(called) == STEPS


def _declaration(root: Path, **settings: Any) -> Declaration:
    policy = {"receive_retry_count": 0, "max_retry_cycles": 0, "retry_cycle_delay": 0,
              "receive_error_handling": "move", "outage_threshold": 0}
    return parse_declaration({"lake_root": str(root), "spark": SPARK.model_dump(), "lease": {"expiry": "1s"},
                              "queues": {"q": {"handler": "poison_pipeline_tests.handlers:scripted",
                                               "policy": policy}}, **settings})


def _records(*ids: str, **body: Any) -> list[dict[str, Any]]:
    return [{"message_id": i, "message_type": "t", "body": body} for i in ids]


# note, inbound commit, intake commit
ENQUEUE_STEPS = 3


@pytest.mark.parametrize("step", range(1, ENQUEUE_STEPS + 1))
def test_an_enqueue_fails_loudly_at_every_commit_point_and_nothing_is_counted_twice(spark, tmp_path, monkeypatch,
                                                                                    step):
    declaration = _declaration(tmp_path / "lake")
    assert enqueue(declaration, "q", _records("a0")).accepted == 1
    code = ERRORS[step % len(ERRORS)]
    at_step(monkeypatch, LOW_STEPS, step, _raise(code))
    with pytest.raises(StorageFailure) as failed:
        enqueue(declaration, "q", _records("a1", "a2"))
    monkeypatch.undo()
    landed = step == ENQUEUE_STEPS
    _assert_loud(failed.value, code, ["_work/intake/", "table inbound", "table intake"][step - 1])
    if landed:
        assert "are in queue 'q'" in str(failed.value) and "do not enqueue them again" in str(failed.value)
    else:
        assert "Nothing was enqueued into queue 'q': enqueue the 2 message(s) again" in str(failed.value)
        assert enqueue(declaration, "q", _records("a1", "a2")).accepted == 2
    # The next enqueue records what the failed one left uncounted; the cycle finds it balanced.
    assert enqueue(declaration, "q", _records("a3")).accepted == 1
    _balanced(declaration, 4)
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration) == {f"a{i}": ["processed:processed"] for i in range(4)}
    _balanced(declaration, 4)
    assert not list((tmp_path / "lake" / "q" / "_work").glob("intake/*.json")), "a note left behind"


def test_a_cycle_records_the_intake_an_enqueue_left_uncounted(spark, tmp_path, monkeypatch):
    declaration = _declaration(tmp_path / "lake")
    at_step(monkeypatch, LOW_STEPS, ENQUEUE_STEPS, _raise(errno.ENOSPC))
    with pytest.raises(StorageFailure):
        enqueue(declaration, "q", _records("a1", "a2"))
    monkeypatch.undo()
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration) == {"a1": ["processed:processed"], "a2": ["processed:processed"]}
    _balanced(declaration, 2)


def test_an_enqueue_that_may_still_run_on_another_host_is_left_to_finish(tmp_path, monkeypatch):
    declaration = _declaration(tmp_path / "lake")
    at_step(monkeypatch, LOW_STEPS, ENQUEUE_STEPS, _raise(errno.EIO))
    with pytest.raises(StorageFailure):
        enqueue(declaration, "q", _records("a1"))
    monkeypatch.undo()
    [note] = (tmp_path / "lake" / "q" / "_work" / "intake").glob("*.json")
    written = json.loads(note.read_text())
    tables = QueueTables.of(declaration, "q")
    for minutes_ago, settled in ((1, []), (11, [written["batch_id"]])):
        at = datetime.now(UTC) - timedelta(minutes=minutes_ago)
        note.write_text(json.dumps({**written, "host": "another-host", "written": at.isoformat()}))
        assert settle_intake(LeaseFreeAppender(tables)) == settled
    assert not note.exists()
    _balanced(declaration, 1)


@pytest.fixture(scope="module")
def poisoned(spark, tmp_path_factory) -> Path:
    """A lake with three messages in q's poison table."""
    lake = tmp_path_factory.mktemp("poisoned") / "lake"
    declaration = _declaration(lake)
    assert enqueue(declaration, "q", _records("p1", "p2", "p3", fail=True)).accepted == 3
    run_cycle(spark, declaration, "q", "inbound")
    QueueTables.of(declaration, "q").ensure()
    assert places(declaration) == {f"p{i}": ["poison"] for i in (1, 2, 3)}
    return lake


# actions planned, plan (a row of the plans table), inbound, poison rewrite, actions done, plan removed
REDRIVE_COMMITS = 6


@pytest.mark.parametrize("step", range(1, REDRIVE_COMMITS + 1))
def test_a_redrive_fails_loudly_at_every_commit_point_and_completes_when_run_again(poisoned, tmp_path, monkeypatch,
                                                                                   step):
    shutil.copytree(poisoned, tmp_path / "lake")
    declaration = _declaration(tmp_path / "lake")
    code = ERRORS[step % len(ERRORS)]
    called = at_step(monkeypatch, REDRIVE_STEPS, step, _raise(code))
    with pytest.raises(StorageFailure) as failed:
        redrive_table(declaration, "q", "poison", Selection(), redrive_id="r1")
    monkeypatch.undo()
    assert len(called) == step
    where = ["appending to a table (table actions", "appending to a table (table plans",
             "appending to a table (table inbound", "rewriting batches of a table (table poison",
             "(table actions", "removing the plan of action r1 (table plans"][step - 1]
    _assert_loud(failed.value, code, where)
    result = redrive_table(declaration, "q", "poison", Selection(), redrive_id="r1")
    assert result.moved == 3 or step == REDRIVE_COMMITS, result
    assert places(declaration) == {f"p{i}": ["inbound"] for i in (1, 2, 3)}
    assert [(a.action_id, a.state) for a in list_actions(declaration, "q")] == [("r1", "done")]
    assert rows(declaration, PLANS) == [], "a plan left behind"
    _balanced(declaration, 3)


def test_the_redrive_commit_points_are_the_ones_the_faults_cover(poisoned, tmp_path, monkeypatch):
    shutil.copytree(poisoned, tmp_path / "lake")
    called = at_step(monkeypatch, REDRIVE_STEPS, 0, _raise(errno.EIO))
    redrive_table(_declaration(tmp_path / "lake"), "q", "poison", Selection(), redrive_id="r1")
    assert len(called) == REDRIVE_COMMITS, called


# -- a real file system that refuses writes -----------------------------------------------------


def _runs(*command: str) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


@functools.cache
def read_only_kind() -> str:
    """How this machine makes a folder read-only: `bind-mount` (root), `chmod` (not root), else
    `injected-EROFS` (root without the right to mount)."""
    if os.geteuid() != 0:
        return "chmod"
    with tempfile.TemporaryDirectory() as folder:
        if _runs("mount", "--bind", folder, folder):
            _runs("umount", folder)
            return "bind-mount"
    return "injected-EROFS"


@functools.cache
def full_disk_kind() -> str:
    """`tmpfs` where a size-limited file system can be mounted (root), else `injected-ENOSPC`."""
    if os.geteuid() != 0:
        return "injected-ENOSPC"
    with tempfile.TemporaryDirectory() as folder:
        if _runs("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", folder):
            _runs("umount", folder)
            return "tmpfs"
    return "injected-ENOSPC"


@contextmanager
def read_only(folder: Path, kind: str) -> Iterator[Callable[[], None]]:
    """Yield what makes `folder` read-only; whatever happens, it is writable again afterwards."""
    made = {"done": False}

    def make() -> None:
        if kind == "bind-mount":
            subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
            made["done"] = True
            subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        elif kind == "chmod":
            for path in [folder, *folder.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o555)
            made["done"] = True

    try:
        yield make
    finally:
        if made["done"] and kind == "bind-mount":
            subprocess.run(["umount", str(folder)], check=True)
        elif made["done"]:
            for path in [folder, *folder.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o755)


# The table made read-only, and the durable step of the crash test's cycle that then fails: the
# processed commit (an append), or the delete of the taken batches from inbound (delta-rs words
# that one as a multi-line OSError with terminal colours).
READ_ONLY_CASES = {"processed": 5, "inbound": 8}


@pytest.mark.parametrize("table", READ_ONLY_CASES)
@pytest.mark.parametrize("kind", [read_only_kind()])
def test_a_table_folder_made_read_only_mid_cycle(spark, tmp_path, monkeypatch, kind, table):
    baseline = scenario(tmp_path / "baseline")
    run_cycle(spark, baseline, "q", "inbound")
    declaration = scenario(tmp_path / "lake")
    folder = tmp_path / "lake" / "q" / table
    with read_only(folder, kind) as make_read_only:
        # While the cycle runs: after it staged its results, before its first commit.
        def turn_read_only(step: int) -> None:
            if kind.startswith("injected"):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            make_read_only()

        # Once the journal says staged (its third step is the first commit), or just before the step.
        step = READ_ONLY_CASES[table]
        at_step(monkeypatch, LOW_STEPS, step if kind.startswith("injected") else 3, turn_read_only)
        with pytest.raises(StorageFailure) as failed:
            run_cycle(spark, declaration, "q", "inbound")
        monkeypatch.undo()
    _assert_loud(failed.value, errno.EROFS, f"table {table} of queue 'q' at {folder}")
    run_cycle(spark, declaration, "q", "inbound")
    assert outcome(declaration) == outcome(baseline)
    _balanced(declaration, 4)


@contextmanager
def small_disk(folder: Path, kind: str) -> Iterator[Callable[[], None]]:
    """Yield what fills the disk under `folder`; the disk is freed and unmounted afterwards."""
    folder.mkdir(parents=True)
    if kind == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], check=True)
    filler = folder / "filler"

    def fill() -> None:
        with filler.open("wb") as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC

    try:
        yield fill
    finally:
        filler.unlink(missing_ok=True)
        if kind == "tmpfs":
            _unmount(folder)


def _unmount(folder: Path) -> None:
    """Unmount `folder`, waiting for a file a background thread still holds there (delta-rs's
    runtime finishes a failed upload after the call that started it returned); then lazily."""
    deadline = time.monotonic() + 30
    while subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)
            return
        time.sleep(0.5)


@pytest.mark.parametrize("kind", [full_disk_kind()])
def test_a_full_disk_under_a_cycle(spark, tmp_path, monkeypatch, kind):
    baseline = scenario(tmp_path / "baseline")
    run_cycle(spark, baseline, "q", "inbound")
    disk = tmp_path / "disk"
    with small_disk(disk, kind) as fill:
        lake = disk / "lake"
        # The full disk also stops the lease's release: it expires after a second for the next run.
        declaration = scenario(lake, lease={"expiry": "1s"})

        def disk_full(step: int) -> None:
            if kind.startswith("injected"):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            fill()

        # After the journal says staged: the attempts commit finds the disk full.
        at_step(monkeypatch, LOW_STEPS, 3, disk_full)
        with pytest.raises(StorageFailure) as failed:
            run_cycle(spark, declaration, "q", "inbound")
        monkeypatch.undo()
        _assert_loud(failed.value, errno.ENOSPC, f"table attempts of queue 'q' at {lake}/q/attempts")
        (disk / "filler").unlink(missing_ok=True)
        run_cycle(spark, declaration, "q", "inbound")
        assert outcome(declaration) == outcome(baseline)
        _balanced(declaration, 4)


# -- what the command line says -------------------------------------------------------------------


def _cli(config: Path, *args: str, inject: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    program = [sys.executable, "-m", "poison_pipeline_tests.faulty_cli", inject] if inject else \
        [sys.executable, "-m", "poison_pipeline.cli"]
    return subprocess.run([*program, "--config", str(config), *args], capture_output=True, text=True, env=env,
                          cwd=config.parent, timeout=120)


def _assert_one_paragraph(done: subprocess.CompletedProcess[str], where: str, code: int) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("poison-pipeline enqueue: error:")]
    assert where in line and f"[{errno.errorcode[code]}]" in line, line
    return line


CLI_CASES = [f"inbound read-only ({read_only_kind()})", "intake full (injected-ENOSPC)"]


@pytest.mark.parametrize("case", CLI_CASES)
def test_the_command_line_names_the_table_and_the_os_error(tmp_path, case):
    declaration = _declaration(tmp_path / "lake")
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    messages = tmp_path / "m.jsonl"
    messages.write_text("\n".join(json.dumps(r) for r in _records("c1", "c2")) + "\n")
    assert enqueue(declaration, "q", _records("c0")).accepted == 1
    inbound = tmp_path / "lake" / "q" / "inbound"
    if case.startswith("inbound"):
        kind = read_only_kind()
        with read_only(inbound, kind) as make_read_only:
            make_read_only()
            done = _cli(config, "enqueue", str(messages), "--queue", "q",
                        inject="EROFS:2" if kind.startswith("injected") else "")
        line = _assert_one_paragraph(done, f"table inbound of queue 'q' at {inbound}", errno.EROFS)
        assert "Nothing was enqueued into queue 'q'" in line
        assert _cli(config, "enqueue", str(messages), "--queue", "q").returncode == 0
    else:
        done = _cli(config, "enqueue", str(messages), "--queue", "q", inject="ENOSPC:3")
        line = _assert_one_paragraph(done, "table intake of queue 'q'", errno.ENOSPC)
        assert "do not enqueue them again" in line
    assert enqueue(declaration, "q", _records("c3")).accepted == 1
    _balanced(declaration, 4)
    assert set(places(declaration)) == {"c0", "c1", "c2", "c3"}


# -- what a Dagster run shows -------------------------------------------------------------------


def test_a_dagster_cycle_run_fails_naming_the_table_and_the_next_run_completes_it(spark, tmp_path, monkeypatch):
    baseline = scenario(tmp_path / "baseline")
    run_cycle(spark, baseline, "q", "inbound")
    declaration = scenario(tmp_path / "lake")
    job = build_definitions(declaration).resolve_job_def(job_name("q", "inbound"))
    with DagsterInstance.ephemeral() as instance:
        at_step(monkeypatch, LOW_STEPS, READ_ONLY_CASES["processed"], _raise(errno.ENOSPC))
        failed = job.execute_in_process(instance=instance, run_config=QUIET, raise_on_error=False)
        monkeypatch.undo()
        assert not failed.success
        text = failure_text(failed)
        assert "StorageFailure" in text and "table processed of queue 'q'" in text and "[ENOSPC]" in text, text
        again = job.execute_in_process(instance=instance, run_config=QUIET)
    assert again.success
    # Every check passes but the failure tables' depth, which warns of the scenario's failed messages.
    assert all(check.passed for check in again.get_asset_check_evaluations() if check.check_name != "depth"), \
        "a check failed after the rerun"
    assert outcome(declaration) == outcome(baseline)


def test_enqueues_and_deletes_of_taken_batches_at_once_all_commit(tmp_path):
    """delta-rs may refuse one of an append and a delete made at once although they touch different
    files; both are made again on the newer table, so neither an enqueue nor a cycle fails for it."""
    lake = str(tmp_path / "lake")
    declaration = cc.declaration(lake)
    for i in range(25):
        enqueue(declaration, "q", [json.dumps({"message_id": f"old{i}", "message_type": "t"})])
    tables = QueueTables.of(declaration, "q")
    batches = sorted(set(tables.open(INBOUND).to_pyarrow_table(columns=["batch_id"])["batch_id"].to_pylist()))
    spawn = multiprocessing.get_context("spawn")
    errors = spawn.Queue()
    workers = [spawn.Process(target=cc.enqueue_each, args=(lake, "new", 25, errors)),
               spawn.Process(target=cc.delete_each, args=(lake, batches, errors))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found and all(w.exitcode == 0 for w in workers), found
    ids = sorted(tables.open(INBOUND).to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist())
    assert ids == sorted(f"new{i}" for i in range(25))
