"""In-flight markers: which message a Spark task was handling when its Python worker died.

Written only on the careful re-run of a cycle whose job lost a worker (a handler that killed its
process), so the common path pays nothing. Each task keeps one small file naming the message it
is delivering and removes it when its partition is done: what is left after a crash names the
culprit.
"""

from __future__ import annotations

import uuid

import pyarrow.fs as pafs

from poison_pipeline.storage.journal import fs_of


class Marker:
    """The marker of one task: `mark` before each delivery, `clear` when the partition is done."""

    def __init__(self, folder: str) -> None:
        self.fs, folder_path = fs_of(folder)
        self.fs.create_dir(folder_path, recursive=True)
        self.path = f"{folder_path}/{uuid.uuid4().hex}"

    def mark(self, message_id: str) -> None:
        with self.fs.open_output_stream(self.path) as stream:
            stream.write(message_id.encode())

    def clear(self) -> None:
        if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            self.fs.delete_file(self.path)


def culprits(folder: str) -> list[str]:
    """The messages that tasks were handling when they died; the markers are removed."""
    fs, path = fs_of(folder)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    found = []
    for info in fs.get_file_info(pafs.FileSelector(path)):
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as stream:
                found.append(stream.read().decode())
            fs.delete_file(info.path)
    return found
