"""Delivering a small cycle without a Spark job: the same Processor, in a worker process of its own.

A Spark job costs a fixed few hundred milliseconds to schedule, more than a cycle of a few hundred
messages takes to deliver. Small cycles (SmallCycles in the declaration) run `Processor` over the
same parquet files in a process forked for the cycle, as Spark forks its Python workers: from a fork
server started once per driver process with the engine imported, so a fork costs milliseconds and
inherits none of the driver's threads (py4j, delta-rs, the lease renewer, Dagster's). Handler
timeouts work as on an executor (the Processor runs on the worker's main thread), and a handler that
kills its process kills only that worker: the driver, and a Dagster run with it, sees `WorkerDied`
and the cycle does what it does when a Spark worker dies (engine/cycle._stage).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.process
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from poison_pipeline.engine import staged, watchdog
from poison_pipeline.engine.batch import CycleSpec, Processor
from poison_pipeline.engine.id_hashes import HASH_COLUMN, id_hashes
from poison_pipeline.storage import schemas
from poison_pipeline.storage.journal import remove_tree
from poison_pipeline.storage.uri import fs_of, fs_of_all, whole_in

# Spark hands mapInArrow batches of at most this many rows (spark.sql.execution.arrow.maxRecordsPerBatch).
_BATCH_ROWS = 10_000


class WorkerDied(RuntimeError):
    """The worker process delivering a small cycle died (its handler exited or crashed it)."""


def read_due(files: Sequence[str], storage_options: dict[str, str]) -> pa.Table:
    """The rows of the due files (URIs in one lake, whose `storage_options` these are), as Spark
    reads them for a cycle (schemas.MESSAGE, missing columns null)."""
    fs, paths = fs_of_all(files, storage_options)
    # One chunk, not one per file: the worker would process each small enqueue's file as a batch
    # of its own, and pickling the rows to it would pay per chunk and column.
    return pads.dataset(paths, schema=schemas.MESSAGE, format="parquet", filesystem=fs).to_table().combine_chunks()


# --- the fork server (a process of its own) ------------------------------------------------------


def _route(request: bytes) -> tuple[str, object]:
    try:
        spec, rows = pickle.loads(request)
        results = list(Processor(spec)(iter(rows.to_batches(max_chunksize=_BATCH_ROWS))))
        return "ok", pa.Table.from_batches(results, schema=schemas.RESULT)
    except BaseException:  # noqa: BLE001 - the driver raises it with the worker's traceback
        return "error", traceback.format_exc()


def _serve_one(driver: Connection, request: bytes) -> None:
    """Fork a worker for one cycle; relay its results, or that it died before it sent them all."""
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(readable)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        with os.fdopen(writable, "wb") as out:
            out.write(pickle.dumps(_route(request)))
        watchdog.stop()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(writable)
    with os.fdopen(readable, "rb") as results:
        reply = results.read()
    _, status = os.waitpid(pid, 0)
    # A worker that exits early, with any code, never wrote a whole reply.
    if status == 0 and reply:
        driver.send_bytes(reply)
    else:
        driver.send(("died", os.waitstatus_to_exitcode(status)))


def serve(fd: int) -> None:
    """The fork server's loop, until the driver goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the driver to handle
    driver = Connection(fd)
    sys.path[:] = driver.recv()  # the driver's, so handlers import here as they do there
    while True:
        try:
            _serve_one(driver, driver.recv_bytes())
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return  # the driver is gone (killed while a worker delivered): nobody wants the results


# --- the driver's side ---------------------------------------------------------------------------


class _Server:
    def __init__(self, by_fork: bool = False) -> None:
        ours, theirs = socket.socketpair()
        self.forked: multiprocessing.process.BaseProcess | None = None
        self.process: subprocess.Popen[bytes] | None = None
        if by_fork:
            self.forked = multiprocessing.get_context("fork").Process(
                target=_serve_forked, args=(ours.fileno(), theirs.fileno()), daemon=True)
            self.forked.start()
        else:
            command = f"from poison_pipeline.engine.local import serve; serve({theirs.fileno()})"
            self.process = subprocess.Popen([sys.executable, "-c", command], pass_fds=[theirs.fileno()],
                                            stdin=subprocess.DEVNULL)
        theirs.close()
        self.connection = Connection(ours.detach())
        self.connection.send(sys.path)
        atexit.register(self.stop)

    def running(self) -> bool:
        if self.forked is not None:
            return self.forked.exitcode is None
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Let the server go (it exits at the end of its input) and reap it."""
        self.connection.close()
        if self.forked is not None:
            self.forked.join(timeout=5)
        elif self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)


def _serve_forked(driver_end: int, fd: int) -> None:
    os.close(driver_end)  # the driver's end, inherited by the fork: the server must see it close
    serve(fd)


_lock = threading.Lock()
_server: _Server | None = None


def warm(by_fork: bool = False) -> None:
    """Start the fork server if it is not running: it imports the engine while the driver goes on.

    `by_fork` forks it from this process instead of starting a new interpreter, when this process is
    still single-threaded and has the engine imported: a Dagster run's process just forked from the
    warm run worker (poison_pipeline/runs), which then pays no interpreter start for its small cycles."""
    global _server
    with _lock:
        if _server is None or not _server.running():
            _server = _Server(by_fork)


def _deliver(spec: CycleSpec, rows: pa.Table) -> tuple[str, object]:
    global _server
    warm()
    with _lock:
        assert _server is not None
        try:
            _server.connection.send_bytes(pickle.dumps((spec, rows)))
            return _server.connection.recv()
        except (EOFError, OSError):
            _server = None  # killed with its worker (a handler that killed its process group): a new one next time
            return "died", None


def stage(rows: pa.Table, spec: CycleSpec, staging: str) -> None:
    """Deliver `rows` in a worker process and write its results to `staging` as the Spark job would.

    Raises WorkerDied when the worker died before it sent its results (nothing is written then)."""
    kind, payload = _deliver(spec, rows)
    if kind == "died":
        raise WorkerDied(f"the worker process delivering {spec.queue}/{spec.table} died (exit code {payload})")
    if kind == "error":
        raise RuntimeError(f"delivering {spec.queue}/{spec.table} failed in its worker process:\n{payload}")
    assert isinstance(payload, pa.Table)
    remove_tree(staging, spec.storage_options)
    fs, path = fs_of(staging, spec.storage_options)
    fs.create_dir(path, recursive=True)
    # Hashed here, as Spark's tasks stage them: the commit takes either path's results as they are.
    results = payload.append_column(staged.STAGED.field(HASH_COLUMN), id_hashes(payload["message_id"].to_pylist()))
    for prefix, part in zip((staged.LEDGER_PREFIX, staged.MOVED_PREFIX), staged.split(results), strict=True):
        with whole_in(fs, f"{path}/{prefix}00000.parquet") as file:
            pq.write_table(part, file, **staged.FILE_OPTIONS)
