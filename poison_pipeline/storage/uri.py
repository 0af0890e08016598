"""The plain files under a lake root (beside its Delta tables): intake notes, in-flight markers,
a cycle's staged results. Opened with the lake's storage options, and written whole or not at all
on every store. Imports nothing heavier than pyarrow.fs until an object store is opened.

A local path (or file://) opens with pyarrow's local file system. Any other URI (s3://, s3a://,
gs://, az://, abfs[s]://, ...) opens with delta-rs's object_store, rooted at its bucket or container
(the URI up to its path) and given the same storage options as the Delta tables (endpoint,
credentials, region, allow-http): whatever reaches the tables reaches these files.

The rule for a whole write (`whole`), in this one place:
- locally, the file is written under a hidden temporary name in its folder and renamed over its
  final name when complete (a rename is atomic on one file system); a write that fails or is killed
  leaves at most a hidden temporary file, which no reader lists;
- on an object store, the final object is written directly: a multipart upload that only the close
  of a complete write completes (an object appears whole at that moment or never). A rename there is
  a copy then a delete, neither atomic nor cheap, so it is never used. A write that fails is never
  completed; a killed one neither (the store drops an upload never completed).
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs


def is_local(uri: str) -> bool:
    """Whether `uri` is on this machine's disk (a path, file://, or a Windows drive) rather than a store."""
    return "://" not in uri or len(urlparse(uri).scheme) <= 1 or urlparse(uri).scheme == "file"


def fs_of(uri: str, storage_options: dict[str, str]) -> tuple[pafs.FileSystem, str]:
    """The file system holding `uri`, and the path of `uri` in it. `storage_options`: the lake's
    (QueueTables.storage_options), as delta-rs takes them; ignored for a local path."""
    if is_local(uri):
        return pafs.FileSystem.from_uri(uri if "://" in uri else f"file://{uri}")
    root, path = store_root(uri)
    from deltalake.fs import DeltaStorageHandler  # only for an object store: delta-rs is heavy to import

    return pafs.PyFileSystem(DeltaStorageHandler(root, dict(storage_options))), path


def fs_of_all(uris: Sequence[str], storage_options: dict[str, str]) -> tuple[pafs.FileSystem, list[str]]:
    """`fs_of` for many URIs of one lake: their file system, opened once (an object store's costs
    about 10 ms to open), and the path of each in it."""
    fs, _ = fs_of(uris[0], storage_options)
    if is_local(uris[0]):
        return fs, [fs_of(uri, storage_options)[1] for uri in uris]
    return fs, [store_root(uri)[1] for uri in uris]


def store_root(uri: str) -> tuple[str, str]:
    """An object-store URI as its bucket or container (`s3://bucket`, `abfss://c@account.dfs...`)
    and the path inside it (`lake/q/intake/b.json`, without a leading slash)."""
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise ValueError(f"{uri!r} names no bucket or container")
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.strip("/")


def uri_in(uri: str, path: str) -> str:
    """The URI of `path` (a path of `fs_of(uri, ...)`'s file system) in the store of `uri`."""
    if is_local(uri):
        return path
    return f"{store_root(uri)[0]}/{path.lstrip('/')}"


def whole(uri: str, storage_options: dict[str, str]) -> contextlib.AbstractContextManager[pa.NativeFile]:
    """An output stream for the file at `uri` that appears whole when the block ends, or not at
    all when it raises (or the process dies in it): the old file, if any, stays until then."""
    return whole_in(*fs_of(uri, storage_options))


@contextlib.contextmanager
def whole_in(fs: pafs.FileSystem, path: str) -> Iterator[pa.NativeFile]:
    """`whole` for the file at `path` of `fs` (as `fs_of` gave them), for a writer that keeps its
    file system open across many writes."""
    folder, _, name = path.rpartition("/")
    if not _is_store(fs):
        fs.create_dir(folder, recursive=True)
        temporary = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"  # hidden: listings skip it
        try:
            with fs.open_output_stream(temporary) as stream:
                yield stream
            fs.move(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                fs.delete_file(temporary)
            raise
        return
    upload = _Upload(fs, path)
    stream = pa.PythonFile(upload, mode="w")
    try:
        yield stream
    except BaseException:
        stream.close()  # abandons the upload: the object is never completed
        raise
    upload.complete = True
    stream.close()


def absent(fs: pafs.FileSystem, paths: Sequence[str]) -> list[bool]:
    """Whether each of `paths` (of `fs`, as `fs_of` gave it) is absent: one request each on an
    object store, where asking for a file's info also lists its folder (two)."""
    if not _is_store(fs):
        return [info.type == pafs.FileType.NotFound for info in fs.get_file_info(list(paths))]
    found = []
    for path in paths:
        try:
            fs.open_input_file(path).close()
        except FileNotFoundError:
            found.append(True)
        else:
            found.append(False)
    return found


def _is_store(fs: pafs.FileSystem) -> bool:
    """Whether `fs` is an object store opened by `fs_of` (delta-rs's handler; only imported then)."""
    handler_module = sys.modules.get("deltalake.fs")
    return handler_module is not None and isinstance(getattr(fs, "handler", None),
                                                     handler_module.DeltaStorageHandler)


class _Upload:
    """A file object over delta-rs's object-store output stream whose close completes the upload
    only once the write is known whole; otherwise the upload is dropped, never completed."""

    def __init__(self, fs: pafs.PyFileSystem, path: str) -> None:
        # The raw stream: pyarrow's wrapper would complete the upload on any close.
        self._raw: Any = fs.handler._handler.open_output_stream(path)
        self.complete = False
        self.closed = False

    def write(self, data: Any) -> int:
        data = bytes(data)  # pyarrow hands a Buffer; the raw stream takes bytes
        written = self._raw.write(data)
        return len(data) if written is None else written

    def flush(self) -> None:
        self._raw.flush()

    def tell(self) -> int:
        return self._raw.tell()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        raw, self._raw = self._raw, None
        if self.complete:
            raw.close()
        # else: dropped without a close, the upload is never completed (nothing appears)
