"""In-flight markers: which message a Spark task was handling when its Python worker died.

Written only on the careful re-run of a cycle whose job lost a worker (a handler that killed its
process), so the common path pays nothing. Each task keeps one small file naming the message it
is delivering and removes it when its partition is done: what is left after a crash names the
culprit. A worker killed by the watchdog of a hung attempt (engine/watchdog.py) has a timeout note
beside its marker: that message's attempt timed out rather than crashed.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import NamedTuple

import pyarrow.fs as pafs

from poison_pipeline.storage.uri import fs_of


class Marker:
    """The marker of one task: `mark` before each delivery, `clear` when the partition is done."""

    def __init__(self, folder: str) -> None:
        self.fs, folder_path = fs_of(folder)
        self.fs.create_dir(folder_path, recursive=True)
        name = uuid.uuid4().hex
        self.path = f"{folder_path}/{name}"
        # What another process (the watchdog) opens to note a timeout beside this marker.
        self.uri = f"{folder.rstrip('/')}/{name}"

    def mark(self, message_id: str) -> None:
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(message_id.encode())

    def clear(self) -> None:
        if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            self.fs.delete_file(self.path)


TIMEOUT_NOTE = ".timeout"


class Culprit(NamedTuple):
    message_id: str
    timed_out: bool  # killed by the watchdog of its attempt's handler_timeout, not crashed


def note_timeout(marker_uri: str) -> None:
    fs, path = fs_of(marker_uri + TIMEOUT_NOTE)
    with fs.open_output_stream(path) as stream:
        stream.write(b"timeout")


def remove_timeout_note(marker_uri: str) -> None:
    fs, path = fs_of(marker_uri + TIMEOUT_NOTE)
    with contextlib.suppress(OSError):  # never written, or already gone
        fs.delete_file(path)


def culprits(folder: str) -> list[Culprit]:
    """The messages that tasks were handling when they died; the markers (and notes) are removed."""
    fs, path = fs_of(folder)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    files = {info.path for info in fs.get_file_info(pafs.FileSelector(path)) if info.type == pafs.FileType.File}
    found = []
    for marker in sorted(f for f in files if not f.endswith(TIMEOUT_NOTE)):
        with fs.open_input_stream(marker) as stream:
            found.append(Culprit(stream.read().decode(), marker + TIMEOUT_NOTE in files))
        fs.delete_file(marker)
    for note in (f for f in files if f.endswith(TIMEOUT_NOTE)):
        fs.delete_file(note)
    return found
