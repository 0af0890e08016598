"""The hard end of a handler's attempt: what the handler_timeout's alarm cannot interrupt is killed.

The alarm (delivery.attempt) raises HandlerTimeout in the handler's Python code. A handler
stuck inside a C call that holds the GIL or blocks signals never runs that code, and one that
catches the timeout carries on. So a worker delivering with a timeout has a watchdog: a small
process of its own (a thread could not run while a C call holds the GIL) that reads each attempt's
deadline from shared memory and kills the worker (SIGKILL) once an attempt has run `grace` past its
timeout. The cycle treats that like any dead worker (engine/cycle._stage): on its careful re-run,
where each task marks the message in flight, the watchdog first leaves a note beside the marker, so
the message is charged an attempt with outcome `timeout` (HandlerTimeout), not a crash.

Setting a deadline is two writes to shared memory: no system call per attempt.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

# Shared memory: the deadline (time.monotonic(), 0 = no attempt running) and a counter of attempts,
# then where to note a kill (JSON: the in-flight marker of a careful re-run and the lake's storage
# options; empty = nowhere).
_HEAD = struct.Struct("dQI")
_PATH_LIMIT = 65536
_SIZE = _HEAD.size + _PATH_LIMIT
POLL_SECONDS = 0.1


def grace(timeout: float) -> float:
    """How long past its timeout an attempt may run before its worker is killed: enough for the
    alarm's HandlerTimeout to unwind any handler that lets it."""
    return max(1.0, timeout / 10)


class _Shared:
    """The worker's side: the shared memory and the watchdog process watching this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - mapped for the life of the worker
        self.file.truncate(_SIZE)
        self.memory = mmap.mmap(self.file.fileno(), _SIZE)
        self.attempts = 0
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        fd = self.file.fileno()
        command = f"from poison_pipeline.engine.watchdog import watch; watch({self.pid}, {fd})"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        return subprocess.Popen([sys.executable, "-c", command], pass_fds=[fd], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.process.poll() is None


_shared: _Shared | None = None


def prepare(note: str | None, storage_options: dict[str, str]) -> None:
    """Make sure a watchdog watches this process, and say where it notes a kill (a marker's URI,
    in the lake whose `storage_options` these are).

    Called when a task starts delivering with a timeout; `arm` does nothing until it is."""
    global _shared
    if _shared is None or _shared.pid != os.getpid() or not _shared.alive():
        _shared = _Shared()  # a forked worker does not inherit its parent's watchdog
    raw = json.dumps([note, storage_options]).encode() if note else b""
    if len(raw) > _PATH_LIMIT:
        raw = b""  # a marker path this long is not noted: the kill counts as a crash
    struct.pack_into(f"{len(raw)}s", _shared.memory, _HEAD.size, raw)
    _HEAD.pack_into(_shared.memory, 0, 0.0, _shared.attempts, len(raw))


def arm(timeout: float) -> None:
    """An attempt starts: past `timeout` plus its grace, the watchdog kills this process."""
    shared = _shared
    if shared is not None:
        shared.attempts += 1
        struct.pack_into("dQ", shared.memory, 0, time.monotonic() + timeout + grace(timeout), shared.attempts)


def disarm() -> None:
    """The attempt ended (however)."""
    shared = _shared
    if shared is not None:
        struct.pack_into("d", shared.memory, 0, 0.0)


def stop() -> None:
    """End this process's watchdog and reap it, when the process is about to end: an orphaned one
    would end by itself, but might never be reaped (a container whose first process reaps nothing)."""
    global _shared
    if _shared is not None and _shared.pid == os.getpid():
        _shared.process.kill()
        _shared.process.wait()
    _shared = None


# --- the watchdog process ------------------------------------------------------------------------


def watch(parent: int, fd: int) -> None:
    """Watch `parent` until it exits; kill it if an attempt overruns its deadline."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the driver to handle
    memory = mmap.mmap(fd, _SIZE)
    while os.getppid() == parent:
        deadline, attempt, length = _HEAD.unpack_from(memory, 0)
        left = deadline - time.monotonic() if deadline else POLL_SECONDS
        if left > 0:
            time.sleep(min(left, POLL_SECONDS))
            continue
        note = bytes(memory[_HEAD.size:_HEAD.size + length]).decode() if length else None
        if note and not _write_note(note):
            note = None  # the kill still happens; it will count as a crash
        # The attempt may have ended while the note was written: then it must not be charged.
        if _HEAD.unpack_from(memory, 0)[:2] != (deadline, attempt) or os.getppid() != parent:
            if note:
                _remove_note(note)
            continue
        os.kill(parent, signal.SIGKILL)
        return


def _write_note(marker: str) -> bool:
    # Imported here: the watchdog needs pyarrow only when it kills, not to start.
    from poison_pipeline.storage.inflight import note_timeout

    try:
        uri, storage_options = json.loads(marker)
        note_timeout(uri, storage_options)
    except Exception:  # noqa: BLE001 - a storage error must not stop the kill
        return False
    return True


def _remove_note(marker: str) -> None:
    from poison_pipeline.storage.inflight import remove_timeout_note

    uri, storage_options = json.loads(marker)
    remove_timeout_note(uri, storage_options)
