"""Every way a handler can fail (issue 11), on both delivery paths: a small cycle's worker process
beside the driver and a Spark job. One message per kind in one batch, so each cycle also proves that
no other message of the batch is affected; what each kind does is the table in the README's
"Writing a handler"."""

from __future__ import annotations

import json
import os
import stat
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.engine import local
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline_tests.failure_handlers import FLOOD_BYTES, HANDLER
from poison_pipeline_tests.support import attempts_of, places, rows

PATHS = pytest.mark.parametrize("max_messages", [0, 1000], ids=["spark", "small"])
TIMEOUT = "poison_pipeline.domain.errors.HandlerTimeout"
HEADERS = {"origin": "erp"}


def _declaration(make_declaration: Any, max_messages: int, **policy: Any) -> Declaration:
    # 2 s, not 1: a loaded machine can stretch an innocent attempt's first call past one second.
    base = {"max_retry_cycles": 0, "retry_cycle_delay": 0, "handler_timeout": "2s"}
    return make_declaration({"q": {"handler": HANDLER, "policy": {**base, **policy}}},
                            small_cycles={"max_messages": max_messages})


def _send(declaration: Declaration, ids: list[str], log: Path) -> None:
    """One message per id; its kind is the id up to `#` (`ok#2` is a second `ok`)."""
    records = [{"message_id": mid, "message_type": "test", "headers": HEADERS,
                "body": {"kind": mid.partition("#")[0], "log": str(log)}} for mid in ids]
    assert not enqueue(declaration, "q", records).refused


def _effects(log: Path) -> tuple[Counter[tuple[str, str]], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return Counter((line["id"], line["event"]) for line in lines), lines


def _attempts(declaration: Declaration, message_id: str) -> list[tuple[int, str, str | None]]:
    return [(a["attempt"], a["outcome"], a["error_type"]) for a in attempts_of(declaration, message_id)]


def _output_files(spark: Any, max_messages: int) -> list[str]:
    """Where what handlers print ends up: the stdout and stderr of the small cycles' fork server
    (its workers inherit them), or of Spark's JVM (which copies its Python workers' output there)."""
    if max_messages:
        local.warm()
        assert local._server is not None
        pid = local._server.process.pid
    else:
        pid = spark.sparkContext._gateway.proc.pid
    return [f"/proc/{pid}/fd/{fd}" for fd in (1, 2)]


def _sizes(files: list[str]) -> list[int]:
    sizes = []
    for name in files:
        info = os.stat(name)
        if not stat.S_ISREG(info.st_mode):
            pytest.fail(f"{name} is not a file, so what handlers print cannot be measured: run pytest with "
                        "its default output capture (not -s)")
        sizes.append(info.st_size)
    return sizes


def _printed_since(files: list[str], before: list[int], expect: bytes) -> bytes:
    """What was written to `files` since `before`, once `expect` is in it (Spark copies its workers'
    output on a thread of its own) or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        printed = b""
        for name, start in zip(files, before, strict=True):
            with open(name, "rb") as stream:
                stream.seek(start)
                printed += stream.read(64 << 20)
        if expect in printed or time.monotonic() > deadline:
            return printed
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def _watchdogs() -> dict[int, int]:
    """Watchdog processes (engine/watchdog.py) alive now -> the worker each watches."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "engine.watchdog import watch; watch(" in command:
                found[int(entry.name)] = int(command.split("watch(", 1)[1].split(",", 1)[0])
    return found


def _no_orphan_watchdogs() -> None:
    """Every watchdog watches a live process: the watchdog of a worker that ended has ended too."""
    deadline = time.monotonic() + 5
    while any(not Path(f"/proc/{parent}").exists() for parent in _watchdogs().values()):
        assert time.monotonic() < deadline, f"watchdogs of dead workers are still running: {_watchdogs()}"
        time.sleep(0.1)


# --- kinds that stay inside their attempt: the worker survives them ------------------------------

# Kind -> its attempts (receive_retry_count 1: two per cycle) and where the message ends.
_ABORTS = {
    "exception": "ValueError",
    "unprintable_exception": "poison_pipeline_tests.failure_handlers.Unprintable",
    "system_exit": "SystemExit",
    "keyboard_interrupt": "KeyboardInterrupt",
    "generator_exit": "GeneratorExit",
    "memory_error": "MemoryError",
    "recursion_error": "RecursionError",
    "returns_coroutine": "TypeError",  # an `async def` handler never ran its body
    "mutate": "ValueError",
}
CONTAINED: dict[str, tuple[list[tuple[int, str, str | None]], str]] = {
    **{kind: ([(1, "abort", error), (2, "abort", error)], "poison") for kind, error in _ABORTS.items()},
    "python_hang": ([(1, "timeout", TIMEOUT), (2, "timeout", TIMEOUT)], "poison"),
    **{kind: ([(1, "success", None)], "processed:processed")
       for kind in ("ok", "returns_value", "returns_false", "stdout_flood", "leaked_thread", "ok#2")},
}


@PATHS
def test_failures_a_worker_survives_abort_their_attempt_only(spark, make_declaration, tmp_path, max_messages):
    declaration = _declaration(make_declaration, max_messages, receive_retry_count=1, receive_error_handling="move")
    log = tmp_path / "effects.jsonl"
    ids = ["ok", *(kind for kind in CONTAINED if kind not in ("ok", "ok#2")), "ok#2"]
    _send(declaration, ids, log)
    output = _output_files(spark, max_messages)
    before = _sizes(output)

    report = run_cycle(spark, declaration, "q", "inbound")

    # Nothing killed its worker: one delivery of the batch, every attempt on record.
    assert report.worker_deaths == 0
    failed = [kind for kind, (_, where) in CONTAINED.items() if where == "poison"]
    assert report.counts == {"processed": len(ids) - len(failed), "poisoned": len(failed), "messages": len(ids),
                             "attempts": sum(len(attempts) for attempts, _ in CONTAINED.values())}
    assert places(declaration) == {kind: [where] for kind, (_, where) in CONTAINED.items()}
    for kind, (attempts, _) in CONTAINED.items():
        assert _attempts(declaration, kind) == attempts, kind
    # Moved to the poison queue: the abort count starts afresh there, the lifetime total keeps 2.
    poison = {row["message_id"]: row for row in rows(declaration, "poison")}
    assert {(r["abort_count"], r["total_abort_count"], r["move_count"]) for r in poison.values()} == {(0, 2, 1)}
    assert {r["last_error_type"] for r in poison.values()} == {*_ABORTS.values(), TIMEOUT}
    processed = rows(declaration, "processed")
    assert {(r["total_abort_count"], r["move_count"]) for r in processed} == {(0, 0)}

    # The side effects: each message that succeeds was delivered once and went through; each
    # failing one was called once per attempt and never got past its failure (the coroutine
    # handler returned, but the body it returned never ran).
    effects, lines = _effects(log)
    for kind, (_, where) in CONTAINED.items():
        if kind == "returns_coroutine":
            assert (effects[kind, "start"], effects[kind, "done"]) == (2, 2)
        elif where == "poison":
            assert (effects[kind, "start"], effects[kind, "done"]) == (2, 0), kind
        else:
            assert (effects[kind, "start"], effects[kind, "done"]) == (1, 1), kind

    # A mutated message: the next attempt and the stored row see the original.
    seen = [line for line in lines if line["event"] == "saw"]
    assert [(s["attempt"], s["headers"], json.loads(s["body"])["kind"]) for s in seen] == [
        (1, HEADERS, "mutate"), (2, HEADERS, "mutate")]
    stored = poison["mutate"]
    assert (dict(stored["headers"]), stored["message_type"], json.loads(stored["body"])["kind"]) == (
        HEADERS, "test", "mutate")

    # 2 GiB written to stdout: the first MiB passes, then one line says the rest was dropped.
    notice = b"[poison_pipeline] the handler wrote more than 1048576 characters to stdout in message 'stdout_flood'"
    printed = _printed_since(output, before, notice)
    assert notice in printed
    assert len(printed) < 8 << 20 < FLOOD_BYTES

    # The leaked non-daemon thread did not keep its worker alive (small cycles: the worker ended), nor
    # stop the next task of a reused Spark worker.
    [worker] = {line["pid"] for line in lines if line["id"] == "leaked_thread"}
    if max_messages:
        assert _gone(worker)
    _send(declaration, ["ok#3"], log)
    assert run_cycle(spark, declaration, "q", "inbound").counts["processed"] == 1
    _no_orphan_watchdogs()


# --- kinds that kill their worker ----------------------------------------------------------------

KILLERS = {
    "segfault": (1, "crash", "WorkerDied"),
    "c_hang": (1, "timeout", TIMEOUT),  # deadlocked in libc holding the GIL: the watchdog kills it
    "os_exit": (1, "crash", "WorkerDied"),
}


@PATHS
def test_failures_that_kill_the_worker_are_charged_to_their_message(spark, make_declaration, tmp_path,
                                                                    max_messages):
    declaration = _declaration(make_declaration, max_messages, receive_retry_count=0,
                               receive_error_handling="reject")
    log = tmp_path / "effects.jsonl"
    killers = dict(KILLERS)
    if max_messages:  # a hang in Python that swallows the timeout: the same watchdog, once is enough
        killers["swallowed_hang"] = (1, "timeout", TIMEOUT)
    _send(declaration, ["ok#before", *killers, "ok#after"], log)

    started = time.monotonic()
    report = run_cycle(spark, declaration, "q", "inbound")

    # The first delivery dies at the first killer; each careful re-run names one more, at its attempt.
    assert report.worker_deaths == 1 + len(killers)
    # A hang is killed 1 s (the grace) after its 2 s timeout.
    assert time.monotonic() - started >= 3 * sum(kind.endswith("hang") for kind in killers)
    assert report.counts == {"processed": 2, "rejected": len(killers), "messages": len(killers) + 2,
                             "attempts": len(killers) + 2}
    assert places(declaration) == {**{kind: ["dead_letter"] for kind in killers},
                                   "ok#before": ["processed:processed"], "ok#after": ["processed:processed"]}
    for kind, attempt in killers.items():
        assert _attempts(declaration, kind) == [attempt], kind
    dead = {row["message_id"]: row for row in rows(declaration, "dead_letter")}
    assert {(r["reason"], r["total_abort_count"], r["move_count"]) for r in dead.values()} == {("rejected", 1, 0)}
    assert {kind: dead[kind]["last_error_type"] for kind in killers} == {k: a[2] for k, a in killers.items()}

    # The others: processed once, with one successful attempt on record. Every delivery of them went
    # through; `ok#before` shares the task with the killers, so each delivery that died after it ran
    # it again (nothing of a dead delivery is committed; README: receivers are idempotent by id).
    effects, _ = _effects(log)
    assert _attempts(declaration, "ok#before") == _attempts(declaration, "ok#after") == [(1, "success", None)]
    assert (effects["ok#after", "start"], effects["ok#after", "done"]) == (1, 1)
    assert effects["ok#before", "start"] == effects["ok#before", "done"] == report.worker_deaths + 1
    # A killer is called once per death it caused, and not again once its attempts are spent.
    assert all(effects[kind, "done"] == 0 for kind in killers)
    assert effects["segfault", "start"] == 2 and all(
        effects[kind, "start"] == 1 for kind in killers if kind != "segfault")
    _no_orphan_watchdogs()
