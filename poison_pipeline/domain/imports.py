"""Resolving the `package.module:name` paths a declaration uses for handlers and exceptions.

Parsing a declaration checks how each path is written; importing what it names is a step of its
own (`parse_declaration(..., import_code=True)`, what running queues needs): an operator command
that runs no user code (`redrive`, `purge`) neither needs the application's modules nor runs their
import-time code. `status`, `enqueue` and `check` import them to say which queue's code does not
(views/user_code.py), as Dagster's definitions do, queue by queue. The choice travels in pydantic's
validation context (`IMPORT_CODE`).
"""

from __future__ import annotations

import builtins
import importlib
import re
from typing import Any

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


# The validation-context key that says whether the paths a declaration names are imported.
IMPORT_CODE = "import_code"


def importing(context: Any) -> bool:
    """Whether a validation with this pydantic context imports the code paths name (by default, yes)."""
    return not isinstance(context, dict) or bool(context.get(IMPORT_CODE, True))


def check_path(path: str) -> None:
    """Refuse a path that is not written `package.module:name` (or a builtin name)."""
    if ":" not in path and path.isidentifier() and hasattr(builtins, path):
        return
    if not _IMPORT_PATH.fullmatch(path):  # match's $ would take a final newline
        raise ValueError(f"{path!r} is not an import path: write 'package.module:name'")


def import_object(path: str) -> Any:
    """Import `module:attr`, or a builtin name such as `ValueError`; ValueError says what failed."""
    check_path(path)
    if ":" not in path:
        return getattr(builtins, path)
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
