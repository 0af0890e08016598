"""Opening a lake URI (or a plain path) with pyarrow, importing nothing heavier than pyarrow.fs."""

from __future__ import annotations

import pyarrow.fs as pafs


def fs_of(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri if "://" in uri else f"file://{uri}")
