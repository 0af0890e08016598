"""Resolving the `package.module:name` paths a declaration uses for handlers and exceptions."""

from __future__ import annotations

import builtins
import importlib
import re
from typing import Any

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def import_object(path: str) -> Any:
    """Import `module:attr`, or a builtin name such as `ValueError`; ValueError says what failed."""
    if ":" not in path and path.isidentifier() and hasattr(builtins, path):
        return getattr(builtins, path)
    if not _IMPORT_PATH.fullmatch(path):  # match's $ would take a final newline
        raise ValueError(f"{path!r} is not an import path: write 'package.module:name'")
    module, attr = path.split(":", 1)
    try:
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{path!r} cannot be imported: {error}") from None
    return target


def import_callable(path: str) -> Any:
    target = import_object(path)
    if not callable(target):
        raise ValueError(f"{path!r} is not callable")
    return target


def import_exception(path: str) -> type[BaseException]:
    target = import_object(path)
    if not (isinstance(target, type) and issubclass(target, BaseException)):
        raise ValueError(f"{path!r} is not an exception type")
    return target
