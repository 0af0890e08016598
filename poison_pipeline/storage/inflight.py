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

from poison_pipeline.storage.uri import fs_of, whole, whole_in


class Marker:
    """The marker of one task: `mark` before each delivery, `clear` when the partition is done.
    `storage_options`: the lake's (the folder is under its root)."""

    def __init__(self, folder: str, storage_options: dict[str, str]) -> None:
        self.fs, folder_path = fs_of(folder, storage_options)
        self.fs.create_dir(folder_path, recursive=True)
        name = uuid.uuid4().hex
        self.path = f"{folder_path}/{name}"
        # What another process (the watchdog) opens to note a timeout beside this marker.
        self.uri = f"{folder.rstrip('/')}/{name}"
        self.storage_options = storage_options

    def mark(self, message_id: str) -> None:
        # Whole or not at all: a worker killed while it marks leaves the marker it had (or none).
        with whole_in(self.fs, self.path) as stream:
            stream.write(message_id.encode())

    def clear(self) -> None:
        if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            self.fs.delete_file(self.path)


TIMEOUT_NOTE = ".timeout"


class Culprit(NamedTuple):
    message_id: str
    timed_out: bool  # killed by the watchdog of its attempt's handler_timeout, not crashed


def note_timeout(marker_uri: str, storage_options: dict[str, str]) -> None:
    with whole(marker_uri + TIMEOUT_NOTE, storage_options) as stream:
        stream.write(b"timeout")


def remove_timeout_note(marker_uri: str, storage_options: dict[str, str]) -> None:
    fs, path = fs_of(marker_uri + TIMEOUT_NOTE, storage_options)
    with contextlib.suppress(OSError):  # never written, or already gone
        fs.delete_file(path)


def culprits(folder: str, storage_options: dict[str, str]) -> list[Culprit]:
    """The messages that tasks were handling when they died; the markers (and notes) are removed."""
    fs, path = fs_of(folder, storage_options)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    listed = [info for info in fs.get_file_info(pafs.FileSelector(path)) if info.type == pafs.FileType.File]
    # A hidden file is a mark or note a killed worker never finished (storage/uri.whole): not one.
    files = {info.path for info in listed if not info.base_name.startswith(".")}
    found = []
    for marker in sorted(f for f in files if not f.endswith(TIMEOUT_NOTE)):
        with fs.open_input_stream(marker) as stream:
            found.append(Culprit(stream.read().decode(), marker + TIMEOUT_NOTE in files))
    for info in listed:
        fs.delete_file(info.path)
    return found
