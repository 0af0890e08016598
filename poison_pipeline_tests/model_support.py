"""What the model-based test and the reproductions of "nothing lost" share: a small lake of three
queues, a handler that records every side effect, operations run in-process or in a child process
that is killed or paused at a chosen commit point, and the places a message can be in.

Commit points are counted at stable, low-level places rather than at the product's own private
functions (which move as the product changes): every call into delta-rs that writes a table
(`write_deltalake`, and the `DeltaTable` methods that commit), and every call on a pyarrow file
system that makes a file durable (`open_output_stream`, `move`, `delete_file`, `delete_dir`: plain
files such as intake notes and staged results; on an object store, the completion of an upload and
each delete). The `_lease` table is left out: its commits hold the lease, not
the operation's work, and a renewal thread makes them at times of its own.

A child is forked from a multiprocessing fork server that imported the product once, so a child costs
milliseconds, not the two seconds an import takes. delta-rs's runtime refuses to run in a process
forked after it started, which the fork server's own process never does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from poison_pipeline.domain.envelope import Message

HANDLER = "poison_pipeline_tests.model_support:handle"
# Another handler a declaration change may name: the same side effects, but a `fixable` message is
# taken as fixed, so a change of handler changes what the messages waiting for the old one do next.
LENIENT_HANDLER = "poison_pipeline_tests.model_support:handle_lenient"
HANDLERS = (HANDLER, LENIENT_HANDLER)
EXPIRY_SECONDS = 2.0
# A takeover waits this long after a holder stopped: past its expiry, with room for a late renewal.
PAST_EXPIRY = EXPIRY_SECONDS * 1.8
# On the test run's S3 server a commit can take a second on a loaded machine: a 2 s lease would expire
# while its holder renews it.
STORE_EXPIRY_SECONDS = 4.0
POLICIES: dict[str, dict[str, Any]] = {
    # A retry subqueue due at once, then poison; a poison cycle moves poison to quarantine.
    "qa": {"receive_retry_count": 0, "max_retry_cycles": 1, "retry_cycle_delay": "0s",
           "receive_error_handling": "move"},
    # Failures go to dead_letter.
    "qb": {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "reject"},
    "qc": {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move"},
}
QUEUES = tuple(POLICIES)
FAILURE_TABLES = ("poison", "dead_letter", "quarantine")
LEASE_TABLE = "_lease"
# Commit points a run of each operation usually makes (a cycle that moves messages, a redrive within
# its queue): where a kill is drawn before a run of it has been counted.
USUAL_POINTS = {"cycle": 12, "redrive": 7, "edit": 9, "purge": 6, "undo": 4, "archive": 4, "restore": 4, "ramp": 9}


def write_declaration(folder: Path, queues: dict[str, dict[str, Any]] | None = None,
                      expiry: float = EXPIRY_SECONDS, wait: float = 20.0,
                      store: tuple[str, dict[str, str]] | None = None,
                      handlers: dict[str, str] | None = None) -> Path:
    """The declaration of a lake under `folder` (or at `store`: a lake root on an object store and
    its storage options), small cycles only, a short lease expiry. `handlers`: a queue's handler
    other than HANDLER."""
    chosen = POLICIES if queues is None else queues
    named = handlers or {}
    data: dict[str, Any] = {
        "lake_root": str(folder / "lake") if store is None else store[0],
        "lease": {"wait": f"{wait}s", "expiry": f"{expiry}s"},
        "small_cycles": {"max_messages": 1000},
        "queues": {name: {"handler": named.get(name, HANDLER), "policy": policy} for name, policy in chosen.items()},
    }
    if store is not None:
        data["storage_options"] = store[1]
    path = folder / "decl.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------------------------------ handler

def body_of(folder: Path, fail: str, sleep: float = 0.0) -> dict[str, Any]:
    """A message body: the handler finds its log through it (a fork server keeps the environment it
    started with, so an environment variable could name another test's folder). `fail` is never,
    always, or fixable (fails until the folder's `fixed` file exists)."""
    return {"fail": fail, "dir": str(folder), "sleep": sleep}


def _driver_pid() -> int:
    """The process that ran the cycle: a small cycle delivers in a worker forked by a fork server
    that the driver started, so the driver is the worker's grandparent (1 once the driver died)."""
    try:
        stat = Path(f"/proc/{os.getppid()}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def handle(message: Message) -> None:
    """Record one side effect per call: `start`, then `ok` or `fail`, with the driver's pid and the time."""
    _handle(message, lenient=False)


def handle_lenient(message: Message) -> None:
    """`handle`, with every `fixable` message taken as fixed."""
    _handle(message, lenient=True)


def _handle(message: Message, lenient: bool) -> None:
    raw = message.body
    try:
        body = json.loads(raw if isinstance(raw, (bytes, str)) else b"{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict) or "dir" not in body:
        return
    folder = Path(body["dir"])
    driver = _driver_pid()

    def note(what: str) -> None:
        with open(folder / "effects.log", "a") as out:
            out.write(f"{what} {message.message_id} {driver} {os.getpid()} {time.time():.3f}\n")

    note("start")
    if body.get("sleep"):
        time.sleep(float(body["sleep"]))
    fail = body.get("fail")
    if fail == "always" or (fail == "fixable" and not lenient and not (folder / "fixed").exists()):
        note("fail")
        raise ValueError(f"{fail} failure")
    note("ok")


def age_removals(folder: Path, queue: str, hours: float) -> None:
    """Date every file removal in a local lake's logs of `queue` `hours` back, as a clock moved past
    the retention would see them: delta-rs's vacuum goes by each remove's deletionTimestamp. Each
    log file is replaced whole (a reader never sees one half written)."""
    then = int((time.time() - hours * 3600) * 1000)
    for log in sorted((folder / "lake" / queue).rglob("_delta_log/*.json")):
        actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if not any("remove" in action for action in actions):
            continue
        for action in actions:
            if "remove" in action:
                action["remove"]["deletionTimestamp"] = then
        staged = log.with_name(f".{log.name}.aged")
        staged.write_text("".join(json.dumps(action) + "\n" for action in actions))
        os.replace(staged, log)


@dataclass(frozen=True)
class Effect:
    what: str
    message_id: str
    driver: int
    pid: int
    at: float


def effects(folder: Path) -> list[Effect]:
    path = folder / "effects.log"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        parts = line.split(" ")
        if len(parts) == 5:  # a line a killed worker left half written is no side effect
            found.append(Effect(parts[0], parts[1], int(parts[2]), int(parts[3]), float(parts[4])))
    return found


# ------------------------------------------------------------------------------------ commit points

_DELTA_METHODS = ("delete", "restore", "vacuum", "create_write_transaction", "update", "create_checkpoint",
                  "cleanup_metadata")


@dataclass
class Points:
    """Counts commit points and calls `before(n, label)` / `after(n, label)` around the n-th."""

    before: Callable[[int, str], None]
    after: Callable[[int, str], None]
    labels: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def around(self, label: str, call: Callable[[], Any]) -> Any:
        if f"/{LEASE_TABLE}" in label:
            return call()
        with self._lock:
            self.labels.append(label)
            n = len(self.labels)
        self.before(n, label)
        result = call()
        self.after(n, label)
        return result


def _uri_of(target: Any) -> str:
    if isinstance(target, (str, os.PathLike)):
        return str(target)
    for name in ("table_uri", "_table_uri"):
        value = getattr(target, name, None)
        if isinstance(value, str):
            return value
    inner = getattr(target, "table", None) or getattr(target, "_table", None)
    return _uri_of(inner) if inner is not None and inner is not target else "?"


def install_points(points: Points) -> None:
    """Route every delta-rs write and every durable file operation of this process through `points`.
    Call once per process: the product's modules imported `write_deltalake` by name, so each loaded
    module's reference is replaced as well."""
    import deltalake
    import deltalake.writer
    from deltalake import DeltaTable

    original = deltalake.write_deltalake

    def write_deltalake(table_or_uri: Any, *args: Any, **kwargs: Any) -> Any:
        return points.around(f"write {_uri_of(table_or_uri)}",
                             lambda: original(table_or_uri, *args, **kwargs))

    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name.startswith(("poison_pipeline", "deltalake")) and getattr(module, "write_deltalake", None) is original:
            module.write_deltalake = write_deltalake  # type: ignore[attr-defined]

    def wrap_method(owner: type, name: str) -> None:
        method = getattr(owner, name, None)
        if method is None:
            return

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            return points.around(f"{name} {_uri_of(self)}", lambda: method(self, *args, **kwargs))

        setattr(owner, name, wrapped)

    for name in _DELTA_METHODS:
        wrap_method(DeltaTable, name)
    with contextlib.suppress(ImportError):
        from deltalake.table import TableMerger, TableOptimizer
        wrap_method(TableMerger, "execute")
        wrap_method(TableOptimizer, "compact")
        wrap_method(TableOptimizer, "z_order")
    created = DeltaTable.create.__func__  # type: ignore[attr-defined]

    def create(cls: type, table_uri: Any, *args: Any, **kwargs: Any) -> Any:
        return points.around(f"create {_uri_of(table_uri)}", lambda: created(cls, table_uri, *args, **kwargs))

    DeltaTable.create = classmethod(create)  # type: ignore[method-assign, assignment]
    with contextlib.suppress(ImportError, AttributeError):
        import deltalake.transaction as transaction
        made = transaction.create_table_with_add_actions

        def create_with_actions(table_uri: Any, *args: Any, **kwargs: Any) -> Any:
            return points.around(f"create {_uri_of(table_uri)}", lambda: made(table_uri, *args, **kwargs))

        for module in list(sys.modules.values()):
            if getattr(module, "create_table_with_add_actions", None) is made:
                module.create_table_with_add_actions = create_with_actions  # type: ignore[attr-defined]

    _count_file_writes(points)


def _counting(inner: Any, points: Points) -> Any:
    import pyarrow.fs as pafs
    handler = type("Counting", (_Counting, pafs.FileSystemHandler), {})
    return handler(inner, points)


class _Counting:
    """A pyarrow file system handler over a real file system, counting each durable operation
    (mixed with pyarrow's FileSystemHandler in `_counting`, imported only there)."""

    def __init__(self, inner: Any, points: Points) -> None:
        self.inner = inner
        self.points = points

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Counting) and self.inner.equals(other.inner)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return id(self.inner)

    def get_type_name(self) -> str:
        return f"counting-{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return str(self.inner.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> Any:
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.inner.get_file_info(selector)

    def get_file_info_selector_(self, selector: Any) -> Any:  # pragma: no cover - pyarrow's older name
        return self.inner.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.points.around(f"fs.delete_dir {path}", lambda: self.inner.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.points.around(f"fs.delete_dir_contents {path}",
                           lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        raise PermissionError("the model test never empties a root folder")

    def delete_file(self, path: str) -> None:
        self.points.around(f"fs.delete_file {path}", lambda: self.inner.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self.points.around(f"fs.move {dest}", lambda: self.inner.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self.points.around(f"fs.copy_file {dest}", lambda: self.inner.copy_file(src, dest))

    def open_input_stream(self, path: str) -> Any:
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.points.around(f"fs.open_output_stream {path}",
                                  lambda: self.inner.open_output_stream(path, metadata=metadata))

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.points.around(f"fs.open_append_stream {path}",
                                  lambda: self.inner.open_append_stream(path, metadata=metadata))


def _count_file_writes(points: Points) -> None:
    """Make `pyarrow.fs.FileSystem.from_uri` (how the product opens plain files) hand out a file
    system that counts. A class stands in for `FileSystem`, as `isinstance` checks still expect."""
    import pyarrow.fs as pafs
    real = pafs.FileSystem

    class _Meta(type):
        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, real)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, real)

        def __getattr__(cls, name: str) -> Any:
            return getattr(real, name)

    class FileSystem(metaclass=_Meta):
        @staticmethod
        def from_uri(uri: str) -> tuple[Any, str]:
            inner, path = real.from_uri(uri)
            return pafs.PyFileSystem(_counting(inner, points)), path

    pafs.FileSystem = FileSystem  # type: ignore[misc]
    _count_store_writes(points)


def _count_store_writes(points: Points) -> None:
    """On an object store the product's plain files go through delta-rs's storage handler (not
    `from_uri`): an upload is durable when its complete write closes, a delete when it is made."""
    from deltalake.fs import DeltaStorageHandler

    from poison_pipeline.storage import uri

    close = uri._Upload.close

    def counted_close(self: Any) -> None:
        if self.complete and not self.closed:
            points.around("fs.upload", lambda: close(self))
        else:
            close(self)

    uri._Upload.close = counted_close  # type: ignore[method-assign]
    for name in ("delete_file", "delete_dir", "delete_dir_contents", "move", "copy_file"):
        method = getattr(DeltaStorageHandler, name)

        def wrapped(self: Any, *args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            return points.around(f"fs.{_name} {args[0] if args else ''}", lambda: _method(self, *args, **kwargs))

        setattr(DeltaStorageHandler, name, wrapped)




# ------------------------------------------------------------------------------------- operations

@functools.cache
def _declaration(config: str, stamp: float) -> Any:
    from poison_pipeline.domain.declaration import load_declaration
    return load_declaration(config)


def declaration_of(config: str | Path) -> Any:
    """The declaration at `config`, parsed once while the file is unchanged."""
    return _declaration(str(config), os.stat(config).st_mtime)


def no_spark() -> Any:
    raise AssertionError("small cycles only: no Spark session may be started")


def selection_of(spec: dict[str, Any] | None) -> Any:
    from poison_pipeline.operations.selection import Selection
    chosen = dict(spec or {})
    if "ids" in chosen:
        chosen["ids"] = tuple(chosen["ids"])
    return Selection(**chosen)


def run_op(config: str, op: str, args: dict[str, Any]) -> str:
    """Run one operation as `args` say; returns a short description of its result."""
    declaration = declaration_of(config)
    if op == "cycle":
        from poison_pipeline.operations.cycle import run_cycle
        report = run_cycle(no_spark, declaration, args["queue"], args["table"], run_id=args.get("run_id", "model"))
        return f"cycle {report.counts}"
    if op == "enqueue":
        from poison_pipeline.operations.enqueue import enqueue_data
        data = "".join(json.dumps(line) + "\n" for line in args["lines"]).encode()
        done = enqueue_data(declaration, args["queue"], data)
        return json.dumps({"accepted": done.accepted, "refused": [r.message_id for r in done.refused]})
    if op == "redrive":
        from poison_pipeline.operations.redrive import redrive_table
        result = redrive_table(declaration, args["queue"], args["source"], selection_of(args.get("selection")),
                         to=args.get("to"), redrive_id=args.get("id"), actor="model", run_id="model")
        return f"redrive {result.redrive_id} moved {result.moved} already_done={result.already_done}"
    if op == "edit":
        from poison_pipeline.operations.edit import edit_message
        edited = edit_message(declaration, args["message_id"], args["body"].encode(), queue=args.get("queue"),
                      edit_id=args.get("id"), actor="model", run_id="model")
        return f"edit {edited}"
    if op == "purge":
        from poison_pipeline.operations.purge import purge_table
        purged = purge_table(declaration, args["queue"], args["table"], timedelta(seconds=args.get("older_than", 0)),
                       selection_of(args.get("selection")), purge_id=args.get("id"), actor="model", run_id="model")
        return f"purge {purged}"
    if op in ("archive", "restore"):
        from poison_pipeline.operations import archive as archiving
        chosen = dict(args.get("selection") or {})
        if op == "archive":
            done = archiving.archive(declaration, archiving.ArchiveRequest(
                queue=args["queue"], table=args["table"], id=args.get("id"), **chosen), _acting())
        else:
            done = archiving.restore(declaration, archiving.RestoreRequest(
                queue=args["queue"], table=args["table"], id=args.get("id"), **chosen), _acting())
        return f"{op} {done.action_id} count {done.count} already_done={done.already_done}"
    if op == "ramp":
        from poison_pipeline.operations.redrive import RedriveRequest, redrive
        report = redrive(declaration, RedriveRequest(queue=args["queue"], source_tables=[args["source"]],
                                                     ramp=args["steps"], max_failures=args["max_failures"],
                                                     id=args.get("id")), _acting())
        ramp = report.ramp
        return f"ramp {ramp and ramp.ramp_id} {ramp and ramp.state} step {ramp and ramp.step}"
    if op == "undo":
        from poison_pipeline.operations.undo import undo_action
        return f"undo {undo_action(declaration, args['id'], actor='model', run_id='model')}"
    if op == "maintain":
        from poison_pipeline.operations.maintenance import maintain
        kept = maintain(declaration, args["queue"], vacuum=args.get("vacuum", False),
                        retention=timedelta(seconds=args.get("retention", 7 * 86400)), run_id="model")
        return f"maintained vacuumed {sum(t.vacuumed_files for t in kept.tables)}"
    if op == "end":
        from poison_pipeline.operations.end_conversation import end_conversation_by_operator
        ended = end_conversation_by_operator(declaration, args["queue"], args["conversation"], 1, "ended by model",
                                             "model")
        return f"ended {ended.result.removed_total}"
    raise ValueError(f"operation {op!r}")


def _acting() -> Any:
    from poison_pipeline.operations.requests import ActionContext
    return ActionContext(actor="model", run_id="model")


# ---------------------------------------------------------------------------------- child processes

_CONTEXT: Any = None


def warm_context() -> Any:
    """The multiprocessing context whose children fork from the warm fork server (one per test
    process): the product's modules are imported there once."""
    return _context()


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload([
            "poison_pipeline_tests.model_support", "poison_pipeline.engine.cycle",
            "poison_pipeline.operations.redrive", "poison_pipeline.operations.edit",
            "poison_pipeline.operations.purge", "poison_pipeline.operations.undo", "poison_pipeline.operations.archive",
            "poison_pipeline.operations.ramp",
            "poison_pipeline.operations.enqueue", "poison_pipeline.operations.maintenance",
            "poison_pipeline.operations.end_conversation", "poison_pipeline_tests.operation_process",
            "deltalake", "pyarrow.parquet"])
    return _CONTEXT


def _child(config: str, op: str, args: dict[str, Any], mode: str, at: int, match: str, status: str,
           prepare: str | None) -> None:
    """The body of a child: stop (kill: SIGKILL right after; pause: SIGSTOP right before) the `at`-th
    commit point whose label contains `match`; write what happened to the `status` file."""
    out = Path(status)

    def say(line: str) -> None:
        with open(out, "a") as stream:
            stream.write(line + "\n")

    seen = [0]

    def hit(label: str) -> bool:
        if match not in label:
            return False
        seen[0] += 1
        return seen[0] == at

    def before(n: int, label: str) -> None:
        if mode == "pause" and hit(label):
            say(f"PAUSED {n} {label}")
            os.kill(os.getpid(), signal.SIGSTOP)
            say("RESUMED")

    def after(n: int, label: str) -> None:
        if mode == "kill" and hit(label):
            say(f"KILLED {n} {label}")
            os.kill(os.getpid(), signal.SIGKILL)

    if prepare:
        module, _, name = prepare.partition(":")
        getattr(__import__(module, fromlist=[name]), name)()
    points = Points(before, after)
    install_points(points)
    try:
        result = run_op(config, op, args)
        say(f"POINTS {json.dumps(points.labels)}")
        say(f"DONE {result}")
    except BaseException as error:  # a failure of the operation is an outcome: the test judges the lake
        say(f"POINTS {json.dumps(points.labels)}")
        say(f"FAILED {type(error).__name__}: {str(error)[:300]}")


@dataclass
class Child:
    process: Any
    status: Path

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def lines(self) -> list[str]:
        return self.status.read_text().splitlines() if self.status.exists() else []

    def stopped(self) -> bool:
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def wait_paused_or_done(self, timeout: float = 120.0) -> str:
        """"paused", "done" (it ended, killed or not) or "timeout"."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not self.process.is_alive():
                self.process.join()
                return "done"
            if self.stopped() and any(line.startswith("PAUSED") for line in self.lines()):
                return "paused"
            time.sleep(0.02)
        return "timeout"

    def resume(self, timeout: float = 120.0) -> bool:
        """Continue a paused child and wait for it; False when it had ended while paused (its exit
        code says how: a process may be killed at any time, paused or not)."""
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            self.process.join()
            return False
        self.process.join(timeout)
        if self.process.is_alive():  # a resumed process that never ends is a failure the caller sees
            os.kill(self.pid, signal.SIGKILL)
            self.process.join()
        return True

    def finish(self, timeout: float = 120.0) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            os.kill(self.pid, signal.SIGKILL)
            self.process.join()

    def killed(self) -> bool:
        return any(line.startswith("KILLED") for line in self.lines())

    def outcome(self) -> str:
        lines = self.lines()
        return lines[-1] if lines else f"exit {self.process.exitcode}"


    def points(self) -> list[str] | None:
        """The commit points of a run that ended (None when it did not end by itself)."""
        for line in self.lines():
            if line.startswith("POINTS "):
                return list(json.loads(line[len("POINTS "):]))
        return None


_CHILDREN = Counter[str]()


def start_child(config: Path, op: str, args: dict[str, Any], mode: str, at: int, match: str = "",
                prepare: str | None = None) -> Child:
    """Start `op` in a child process, to be killed right after (mode kill) or paused right before
    (mode pause) its `at`-th commit point whose label contains `match` (mode run: neither)."""
    _CHILDREN["started"] += 1
    status = config.parent / f"child-{_CHILDREN['started']}-{os.getpid()}.status"
    process = _context().Process(
        target=_child, args=(str(config), op, args, mode, at, match, str(status), prepare), daemon=True)
    process.start()
    return Child(process, status)


_COUNTED: list[list[str]] = []


def run_counted(config: str, op: str, args: dict[str, Any]) -> tuple[str, list[str]]:
    """`run_op` in this process, with the commit points it made (to choose where a later run of the
    same operation is stopped, without a dry run). Counting routes delta-rs and pyarrow file systems
    through `install_points` for the rest of the process: only the model test's own process calls it."""
    if not _COUNTED:
        _COUNTED.append([])
        install_points(Points(lambda n, label: None, lambda n, label: None, _COUNTED[0]))
    labels = _COUNTED[0]
    labels.clear()
    try:
        return run_op(config, op, args), list(labels)
    finally:
        labels.clear()


# --------------------------------------------------------------------------------------- the lake

def place_tables(queue: str) -> list[str]:
    """The tables of a queue a message can be in (each row one copy), besides its waiting tables."""
    return ["processed", "dead_letter", "quarantine", "purged"]


def places(config: Path) -> dict[str, list[tuple[str, str]]]:
    """Where each message id is: (queue, table) once per row, across every table of every queue."""
    from poison_pipeline.storage.tables import QueueTables
    declaration = declaration_of(config)
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        for table in (*tables.waiting, *place_tables(queue)):
            # A table read before exists still (a table is never deleted here): asking costs requests.
            if tables.uri(table) not in _SNAPSHOTS and not tables.exists(table):
                continue
            for message_id in _ids_of(tables.uri(table), tables.storage_options):
                found[message_id].append((queue, table))
    return found


# The checks read every table after every step: a table read before is brought up to date (a few new
# commits) rather than loaded again, and read again only when its version moved.
_SNAPSHOTS: dict[str, tuple[Any, int, list[str]]] = {}


def _ids_of(uri: str, storage_options: dict[str, str] | None) -> list[str]:
    from deltalake import DeltaTable

    known = _SNAPSHOTS.get(uri)
    if known is None:
        snapshot = DeltaTable(uri, storage_options=storage_options)
    else:
        snapshot = known[0]
        snapshot.update_incremental()
        if snapshot.version() == known[1]:
            return known[2]
    ids = snapshot.to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist()
    _SNAPSHOTS[uri] = (snapshot, snapshot.version(), ids)
    return ids


def forget_tables() -> None:
    """Drop the snapshots kept for the checks (a sequence's lake is deleted at its end)."""
    _SNAPSHOTS.clear()


def ids_in(config: Path, queue: str, table: str) -> list[str]:
    return sorted(m for m, where in places(config).items() for q, t in where if (q, t) == (queue, table))


def product_lines(config: Path) -> dict[str, tuple[int | None, int, str]]:
    """The product's own conservation per queue, as its `conservation` check reports it (which keeps
    its result while none of the tables it read changed): (received, accounted, line)."""
    from poison_pipeline.operations.checks import check_conservation
    from poison_pipeline.storage.tables import QueueTables
    declaration = declaration_of(config)
    found = {}
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        if not tables.exists("processed"):
            continue
        # As the Dagster check does before it reads: a raised max_retry_cycles names a retry_k that
        # no cycle has written yet.
        tables.ensure()
        books = check_conservation(tables).metadata
        found[queue] = (books["accepted"], books["accounted"], books["line"])  # type: ignore[assignment]
    return found


def actions(config: Path) -> list[Any]:
    from poison_pipeline.operations.actions import list_actions
    declaration = declaration_of(config)
    found = []
    for queue in declaration.queues:
        with contextlib.suppress(FileNotFoundError):
            found.extend(list_actions(declaration, queue))
    return found


def lines_for(folder: Path, ids: list[str], fail: str = "always", conversation: str | None = None,
              sleep: float = 0.0) -> list[dict[str, Any]]:
    made = []
    for message_id in ids:
        line: dict[str, Any] = {"message_id": message_id, "message_type": "t", "body": body_of(folder, fail, sleep)}
        if conversation is not None:
            line["conversation_id"] = conversation
        made.append(line)
    return made


SKEW = timedelta(minutes=3)


def skew_clock() -> None:
    """A host whose wall clock runs SKEW ahead, as the lease module sees it (a child's `prepare`)."""
    from datetime import datetime

    import poison_pipeline.storage.lease as lease

    class Skewed(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return datetime.now(tz) + SKEW

    if hasattr(lease, "datetime"):
        lease.datetime = Skewed  # type: ignore[misc]
    real = time.time
    time.time = lambda: real() + SKEW.total_seconds()  # type: ignore[assignment]
