"""Confinement (issue 11, item 4): message data and operator ids never lead a path out of its folder
(the application's database, the lake root), storage credentials never leave the declaration, and
`make ui` listens on localhost only."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from poison_pipeline.cli import main
from poison_pipeline.defs.naming import job_name
from poison_pipeline.domain.declaration import DeclarationError, load_declaration, parse_declaration
from poison_pipeline.domain.paths import UnsafeName
from poison_pipeline.engine.local_servers import alive, process_links
from poison_pipeline.examples.checks import hook_calls
from poison_pipeline.handlers import UnsafePath, safe_path
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.edit import EditError, edit_message
from poison_pipeline.operations.purge import PurgeError, purge_table
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import RedriveError, redrive_table
from poison_pipeline.operations.status import queue_status
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables
from poison_pipeline.text.status import format_status
from poison_pipeline_tests.support import HANDLER, places, queue, rows, send, table_versions

REPO = Path(__file__).resolve().parents[1]
LAKE_RULE = "cannot name a folder of the lake"


def _stray(root: Path, allowed: Iterable[Path]) -> list[str]:
    """Every file or folder under `root` that is neither inside one of `allowed` nor above one."""
    kept = [Path(a) for a in allowed]
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if not any(p.is_relative_to(a) or a.is_relative_to(p) for a in kept))


def _importable() -> dict[str, str]:
    """The environment of a process started elsewhere than the repo that imports these tests."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _no_spark() -> Any:
    raise AssertionError("a small cycle needs no Spark")


# --- 1. handler paths from message fields ---------------------------------------------------------


def _escapes(tmp_path: Path) -> list[str]:
    """Names that would lead a naive join out of its folder: up to 7 levels up (the last one out of
    this test's folder), absolute, the dot names, NUL, and a URL-encoded climb."""
    return [*("../" * k + f"escape-{k}" for k in range(1, 8)), str(tmp_path / "absolute-escape"),
            "..", ".", "a\0b", "%2e%2e/escape-pct", "~/escape-home"]


def test_safe_path_joins_plain_names_and_refuses_the_rest(tmp_path):
    base = tmp_path / "app_db"
    assert safe_path(base, "profiles", "ann") == base.resolve() / "profiles" / "ann"
    assert safe_path(base, "ünïcode name", "..x", "a\\b") == base.resolve() / "ünïcode name" / "..x" / "a\\b"
    for bad in [*_escapes(tmp_path), "", "x" * 256, "é" * 128, "\udc80", 42]:
        with pytest.raises(UnsafePath, match="path part"):
            safe_path(base, "profiles", bad)  # type: ignore[arg-type]
    (tmp_path / "outside").mkdir()
    base.mkdir()
    (base / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(UnsafePath, match="leads out of"):
        safe_path(base, "link", "x")
    assert [p.name for p in base.iterdir()] == ["link"]  # nothing created


def test_example_handlers_write_hostile_names_only_inside_the_app_db(tmp_path):
    """The demo's accounts and presentations queues, as declared in poison_pipeline.yaml, run real
    (small) cycles on hostile user names and conversation ids: a profile named by one is rejected
    at once, a presentation is kept under a digest of its id, the clean-up hook gets the id as it
    was; nothing is written outside the app db folder and the lake."""
    deep = tmp_path / "a" / "b" / "c" / "d"
    app_db, lake, config = deep / "app_db", tmp_path / "lake", tmp_path / "poison_pipeline.yaml"
    example = json.loads(load_declaration(REPO / "poison_pipeline.yaml").model_dump_json())
    example.update(lake_root=str(lake), queues={q: example["queues"][q] for q in ("accounts", "presentations")})
    config.write_text(yaml.safe_dump(example))
    declaration = load_declaration(config)
    users = [*_escapes(tmp_path), "x" * 10_000]
    accounts = [{"message_id": f"acc-{i}", "message_type": "accounts.create_profile", "conversation_id": f"c-{i}",
                 "sequence_number": 1, "body": {"user": user}} for i, user in enumerate(users)]
    accounts += [{"message_id": f"ann-{n}", "message_type": f"accounts.{kind}", "conversation_id": users[0],
                  "sequence_number": n, "body": {"user": "ann"}}
                 for n, kind in ((1, "create_profile"), (2, "place_order"))]
    conversations = [*_escapes(tmp_path), "y" * 256]
    shown = conversations.pop(2)  # shown in full; the others end with an error at slide 2
    media = lambda c, n: "image/png" if c == shown or n == 1 else "image/bmp"  # noqa: E731
    slides = [{"message_id": f"p-{i}-{n}", "message_type": "presentations.slide", "conversation_id": c,
               "sequence_number": n, "body": {"slide": n, "media": media(c, n)}}
              for i, c in enumerate([shown, *conversations]) for n in (1, 2)]
    for name, records in (("accounts", accounts), ("presentations", slides)):
        result = enqueue(declaration, name, records)
        assert result.accepted == len(records) and not result.refused, result.refused

    deep.mkdir(parents=True)
    run = subprocess.run([sys.executable, "-m", "poison_pipeline_tests.small_cycle_process", str(config),
                          "accounts/inbound", "presentations/inbound"], cwd=deep, capture_output=True, text=True,
                         env={**_importable(), "POISON_PIPELINE_APP_DB": str(app_db)}, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]

    assert _stray(tmp_path, [app_db, lake, config]) == []
    assert not (tmp_path.parent / "escape-7").exists()
    assert sorted(p.name for p in (app_db / "profiles").iterdir()) == ["ann"]
    found = places(declaration, "accounts")
    assert {mid: where for mid, where in found.items() if mid.startswith("ann")} == {
        "ann-1": ["processed:processed"], "ann-2": ["processed:processed"]}
    assert {mid for mid, where in found.items() if where == ["dead_letter"]} == {f"acc-{i}" for i in range(len(users))}
    refused = [(r["message_id"], r["error_type"]) for r in rows(declaration, ATTEMPTS, "accounts")
               if r["outcome"] != "success"]
    # One attempt each: unrecoverable, rejected at once.
    assert sorted(refused) == sorted((f"acc-{i}", "poison_pipeline.handlers.UnsafePath") for i in range(len(users)))
    assert hook_calls(app_db / "conversation_hook.log") == dict.fromkeys(conversations, 1)
    folders = {p.name: sorted(s.name for s in p.iterdir()) for p in (app_db / "presentations").iterdir()}
    assert sorted(folders.values()) == [[]] * len(conversations) + [["slide-1", "slide-2"]]


# --- 2. lake paths from queue names, ids and message data ----------------------------------------

# Names that a path would climb or resolve by, or that only look like an ASCII name.
LEAVING = ["..", ".", "../escape", "/tmp/escape", "a/b", "orders\n", "ｏrders", "ordérs", "orders\0", ""]
HOSTILE_QUEUES = [*LEAVING, "Orders", "_lease", "q" * 64]


def test_queue_names_that_could_leave_the_lake_are_refused_naming_the_rule(tmp_path):
    for name in HOSTILE_QUEUES:
        with pytest.raises(DeclarationError) as refused:
            parse_declaration({"lake_root": str(tmp_path), "queues": {name: {"handler": HANDLER}}})
        assert f"queue name {name!r} must be lowercase letters, digits and _, starting with a letter" in str(
            refused.value)
    assert not list(tmp_path.iterdir())


def test_every_lake_path_part_is_checked(make_declaration):
    tables = QueueTables.of(make_declaration(queue()), "q")
    assert tables.uri("inbound") == f"{tables.lake_root}/q/inbound"
    assert tables.work_uri("redrive", "r-1", "plan.parquet") == f"{tables.lake_root}/q/_work/redrive/r-1/plan.parquet"
    for part in ["..", ".", "../x", "/x", "a/b", "a\\b", "%2e%2e", "a#b", "a?b", "x\n", "", ".hidden", "-x", "ü",
                 "x" * 241]:
        with pytest.raises(UnsafeName, match=LAKE_RULE):
            tables.uri(part)
        with pytest.raises(UnsafeName, match=LAKE_RULE):
            tables.work_uri("staging", part)
    for name in LEAVING:
        with pytest.raises(UnsafeName, match=LAKE_RULE):
            QueueTables(tables.lake_root, name, {}, tables.waiting)


def test_operator_ids_that_would_leave_the_lake_are_refused_before_anything_is_written(make_declaration, tmp_path,
                                                                                     capsys):
    declaration = make_declaration(queue(max_retry_cycles=0, receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    for table in ("inbound", "poison"):
        run_cycle(_no_spark, declaration, "q", table)
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    before = table_versions(declaration)
    body = tmp_path / "body.json"
    body.write_text("{}")
    for hostile in ["../../../escape-id", str(tmp_path / "escape-abs"), "..", "a/b", "x" * 201, "a\0b"]:
        commands = [["redrive", "q", "--from", "quarantine", "--id", hostile],
                    ["purge", "q", "--table", "quarantine", "--older-than", "1d", "--yes", "--id", hostile],
                    ["edit", "bad", "--body-file", str(body), "--id", hostile]]
        for command in commands:
            assert main(["--config", str(config), *command]) == 2, command
            err = capsys.readouterr().err
            assert LAKE_RULE in err and "Traceback" not in err, err
        with pytest.raises(RedriveError, match=LAKE_RULE):
            redrive_table(declaration, "q", "quarantine", redrive_id=hostile)
        with pytest.raises(PurgeError, match=LAKE_RULE):
            purge_table(declaration, "q", "quarantine", "1d", purge_id=hostile)
        with pytest.raises(EditError, match=LAKE_RULE):
            edit_message(declaration, "bad", b"{}", edit_id=hostile)
    assert main(["--config", str(config), "status", "--queue", "../q"]) == 2
    assert "no queue '../q' is declared" in capsys.readouterr().err
    assert table_versions(declaration) == before
    assert places(declaration) == {"bad": ["quarantine"]}
    assert _stray(tmp_path, [tmp_path / "lake", config, body]) == []


def test_hostile_message_and_run_ids_leave_nothing_outside_the_lake(make_declaration, tmp_path):
    """Ids reach the journal, staging, in-flight markers (a handler that kills its worker) and
    checks only as data: every file a cycle writes stays under the lake root."""
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=1, receive_error_handling="move"))
    scripts = [{}, {"fail": True}, {"exit": True}]  # processed; to retry_1; kills its worker, then to retry_1
    bodies = {mid: scripts[i % 3] for i, mid in enumerate(_escapes(tmp_path))}
    send(declaration, bodies, conversation_id="../../../../escape-conversation")
    report = run_cycle(_no_spark, declaration, "q", "inbound", run_id="../../../../escape-run")
    assert report.worker_deaths >= 1
    run_cycle(_no_spark, declaration, "q", "retry_1", run_id=str(tmp_path / "escape-run"))
    assert set(places(declaration)) == set(bodies)  # nothing lost
    assert _stray(tmp_path, [tmp_path / "lake"]) == []
    assert not (tmp_path.parent / "escape-run").exists()


# --- 3. credentials in storage_options ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _leaks(root: Path, secrets: Iterable[str], skip: Iterable[Path]) -> list[str]:
    """Files under `root` (but `skip`) holding a secret: their bytes, and for parquet files (whose
    pages may be compressed) every value they decode to."""
    found, skipped = [], set(skip)
    for path in root.rglob("*"):
        if not path.is_file() or path in skipped:
            continue
        data = path.read_bytes()
        texts = [data]
        if path.suffix == ".parquet":
            texts.append(repr(pq.read_table(path).to_pylist()).encode())
        found += [f"{path.relative_to(root)}: {s}" for s in secrets for t in texts if s.encode() in t]
    return found


@pytest.mark.e2e
def test_storage_options_appear_nowhere_a_run_writes(tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    secrets = {key: f"confine-{key}-{uuid.uuid4().hex}" for key in
               ("aws_access_key_id", "aws_secret_access_key", "azure_storage_account_key", "token")}
    lake, home = tmp_path / "lake", tmp_path / "dagster_home"
    home.mkdir()
    local, unreachable = tmp_path / "local.yaml", tmp_path / "unreachable.yaml"
    spark = {"master": "local[1]", "config": {"spark.sql.shuffle.partitions": "1", "spark.log.level": "INFO"}}
    policy = {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"}
    base = {"spark": spark, "small_cycles": {"max_messages": 0},  # every cycle a Spark job
            "queues": {"q": {"handler": HANDLER, "policy": policy}}}
    local.write_text(yaml.safe_dump({**base, "lake_root": str(lake), "storage_options": secrets}))
    # An object store that refuses connections, with the same credentials and a proxy's password in
    # the endpoint's userinfo: every call fails, and the errors repeat the endpoint.
    password = f"confine-password-{uuid.uuid4().hex}"
    unreachable.write_text(yaml.safe_dump({**base, "lake_root": "s3://confine-bucket/lake", "storage_options": {
        **secrets, "aws_endpoint_url": f"http://proxy:{password}@127.0.0.1:{_free_port()}", "aws_region": "us-east-1",
        "aws_allow_http": "true", "max_retries": "0"}}))
    declaration, broken = load_declaration(local), load_declaration(unreachable)
    send(declaration, {"ok": {}, "bad": {"fail": True}, "../../escape": {"fail": True}})

    out, err = tmp_path / "runs.out", tmp_path / "runs.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        code = subprocess.run(
            [sys.executable, "-m", "poison_pipeline_tests.dagster_run_process", str(home),
             f"{local}:{job_name('q', 'inbound')}", f"{local}:{job_name('q', 'poison')}",
             f"{unreachable}:{job_name('q', 'inbound')}"],
            stdout=stdout, stderr=stderr, env=_importable(), timeout=600, check=False).returncode
    assert code == 0, err.read_text()[-3000:]
    runs = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    assert [r["success"] for r in runs] == [True, True, False], runs
    assert "confine-bucket" in "".join(runs[2]["errors"])  # the failure names the store, not its keys
    log = err.read_text()
    assert 'Setting Spark log level to "INFO"' in log and "DEBUG" in log  # Spark's and Python's logs are here
    assert places(declaration) == {"ok": ["processed:processed"], "bad": ["quarantine"],
                                   "../../escape": ["quarantine"]}
    assert _stray(tmp_path, [lake, home, local, unreachable, out, err]) == []

    # status, from Python and from the command line; an operator action in the actions ledger.
    status = queue_status(declaration, "q", datetime.now(UTC))
    shown = [repr(status), format_status([status]), repr(declaration), str(declaration),
             repr(QueueTables.of(declaration, "q"))]
    for args in (["status"], ["status", "--json"], ["redrive", "q", "--from", "quarantine", "--id", "r1"]):
        assert main(["--config", str(local), *args]) == 0
    # The unreachable store: the exception, and what the command line shows of it.
    with pytest.raises(Exception) as failed:
        queue_status(broken, "q", datetime.now(UTC))
    # (delta-rs's own exception, raised to Python code, repeats the endpoint it was given.)
    raised = [repr(failed.value), "".join(traceback.format_exception(failed.value))]
    assert main(["--config", str(unreachable), "status"]) == 1
    printed = capsys.readouterr()
    assert "confine-bucket" in printed.err and "Traceback" not in printed.err
    shown += [printed.out, printed.err, caplog.text, *(repr(r.__dict__) for r in caplog.records)]

    assert [s for s in secrets.values() if any(s in text for text in raised)] == []
    assert [s for s in [*secrets.values(), password] if any(s in text for text in shown)] == []
    assert (home / "history" / "runs.db").exists() or list(home.rglob("*.db")), sorted(home.rglob("*"))
    assert _leaks(tmp_path, [*secrets.values(), password], skip=[local, unreachable]) == []


# --- 4. `make ui` listens on localhost only --------------------------------------------------------


def _process_tree(root: int) -> set[int]:
    """`root` and every live process descended from it or in a process group one of them leads."""
    links = process_links()
    found, grown = {root}, True
    while grown:
        more = {pid for pid, (parent, group) in links.items()
                if pid not in found and (parent in found or group in found)}
        found |= more
        grown = bool(more)
    return found


def _listening(pids: Iterable[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket in LISTEN state that one of `pids` holds."""
    owner: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with_inode = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd)) if fd.is_symlink() else None
                if with_inode:
                    owner[with_inode.group(1)] = pid
        except OSError:
            continue  # exited meanwhile, or a file descriptor closed while read
    found = []
    for table, size in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in owner:  # 0A: TCP_LISTEN
                address, port = fields[1].split(":")
                found.append((_address(bytes.fromhex(address), size), int(port, 16), owner[fields[9]]))
    return found


def _address(raw: bytes, size: int) -> str:
    # /proc/net/tcp{,6} print each 32-bit word of the address in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))
    return socket.inet_ntop(socket.AF_INET if size == 4 else socket.AF_INET6, words)


LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@pytest.mark.e2e
def test_make_ui_listens_on_localhost_only(tmp_path):
    """tools/ui.py as `make ui` runs it (DAGSTER_HOME the working folder, the repo's dagster.yaml and
    workspace.yaml), with the Spark UI turned on so its port is checked too: once the webserver
    answers and the Connect server accepts sessions, every TCP socket listening in its process
    tree is on the loopback interface."""
    for name in ("dagster.yaml", "workspace.yaml"):
        (tmp_path / name).write_text((REPO / name).read_text())
    (tmp_path / "poison_pipeline.yaml").write_text(yaml.safe_dump({
        "lake_root": "lake",
        "spark": {"master": "local[1]", "config": {"spark.sql.shuffle.partitions": "1", "spark.ui.enabled": "true"}},
        "queues": {"orders": {"handler": "poison_pipeline.examples.handlers:place_order"}}}))
    port = _free_port()
    log = tmp_path / "ui.log"
    with log.open("wb") as out:
        ui = subprocess.Popen([sys.executable, str(REPO / "tools" / "ui.py"), "-p", str(port)], cwd=tmp_path,
                              env={**os.environ, "DAGSTER_HOME": str(tmp_path)}, stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert ui.poll() is None, f"tools/ui.py exited ({ui.returncode}):\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the webserver never answered:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        time.sleep(3)  # the daemon and code server settle beside the webserver
        started = _process_tree(ui.pid)
        names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in started if alive(pid)}
        sockets = _listening(started)
        ports = {p for _, p, _ in sockets}
        connect = re.search(r"Spark Connect server at sc://127\.0\.0\.1:(\d+)", log.read_text())
        assert connect and int(connect.group(1)) in ports and port in ports, (sockets, log.read_text()[-3000:])
        assert len(ports) >= 4, sockets  # the webserver, and the Connect server's gRPC, RPC and UI ports
        exposed = [(a, p, Path(f"/proc/{pid}/cmdline").read_bytes()[:120]) for a, p, pid in sockets
                   if a not in LOOPBACK]
        assert exposed == []
    finally:
        # tools/ui.py stops dagster dev and then the Connect server (by its pid) on SIGTERM.
        os.kill(ui.pid, signal.SIGTERM)
        try:
            ui.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
    # ui.py stopped everything it started (dagster dev's code servers end on their own, a moment later).
    deadline = time.monotonic() + 30
    while (left := [names.get(pid, pid) for pid in started if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []


def test_an_embedded_spark_driver_listens_on_loopback_only(spark):
    """A run's own local[...] session (the test suite's, built as every run builds it) opens its
    driver's ports on 127.0.0.1 only, not on the machine's network address."""
    spark.range(3).count()  # the driver's block manager and RPC ports are open once a job ran
    sockets = _listening(_process_tree(os.getpid()))
    java = [s for s in sockets if b"java" in Path(f"/proc/{s[2]}/cmdline").read_bytes()[:200]]
    assert java, sockets
    assert all(address in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for address, _, _ in java), java
