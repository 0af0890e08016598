"""What a warm process has loaded from disk, to tell when it no longer matches the files."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable

_Stamp = tuple[int, int] | None


def _stamp(path: str) -> _Stamp:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _module_files() -> list[str]:
    # The standard library changes only with the interpreter, which a warm process cannot outlive
    # the meaning of anyway; every other module (the code location, its handlers, installed
    # libraries) can change under a long-lived `dagster dev`.
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    stdlib = tuple({base["stdlib"] + os.sep, base["platstdlib"] + os.sep})
    files = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and (not path.startswith(stdlib) or "site-packages" in path):
            files.append(path)
    return files


class CodeFiles:
    """The modification time and size of every module file loaded, and of `extra` files."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self._stamps = {path: _stamp(path) for path in [*_module_files(), *extra]}

    def __len__(self) -> int:
        return len(self._stamps)

    def changed(self) -> list[str]:
        """The files that changed, appeared or went away since this was taken."""
        return [path for path, stamp in self._stamps.items() if _stamp(path) != stamp]
