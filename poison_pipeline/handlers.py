"""What handler code imports: the declaration of a handler that takes a whole batch at once, and a
checked join for file paths built from message data."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_ATTRIBUTE = "__poison_pipeline_batch__"


def batch_handler(max_messages: int = 500) -> Callable[[F], F]:
    """Mark a handler as taking a list of up to `max_messages` messages per call (like an activation
    procedure that RECEIVEs up to 500 at a time); when a call fails, the pipeline bisects the batch
    to find and charge only the messages that fail."""
    if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
        raise ValueError(f"batch_handler: max_messages must be a positive integer, not {max_messages!r}")

    def mark(handler: F) -> F:
        setattr(handler, _ATTRIBUTE, max_messages)
        return handler

    return mark


def batch_size(handler: Callable[..., Any]) -> int | None:
    """The batch size a handler declared, or None for a handler of one message."""
    return getattr(handler, _ATTRIBUTE, None)


# A file name's limit on Linux and macOS (NAME_MAX), in bytes.
_NAME_MAX = 255


class UnsafePath(ValueError):
    """A path part from message data that would not name one file or folder inside its base."""


def safe_path(base: str | os.PathLike[str], *parts: str) -> Path:
    """`base`/`parts`..., where each part comes from message data (a conversation id, a user name):
    refused with UnsafePath, naming the part and the rule, unless each part is one plain name (no
    separator, not `.` or `..`, no NUL, valid Unicode, at most 255 bytes) and the result, symbolic
    links resolved, lies inside `base`. Nothing is created."""
    root = Path(base).resolve()
    path = root
    for part in parts:
        path = path / _name(part)
    if not path.resolve().is_relative_to(root):
        raise UnsafePath(f"path {path} leads out of {root} (through a symbolic link)")
    return path


def _name(part: object) -> str:
    shown = repr(part) if len(repr(part)) <= 80 else repr(part)[:77] + "..."
    if not isinstance(part, str):
        raise UnsafePath(f"path part {shown} is not text")
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        raise UnsafePath(f"path part {shown} is not valid Unicode (a lone surrogate)") from None
    separators = {"/", os.sep, *([os.altsep] if os.altsep else [])}
    if part in ("", ".", "..") or "\0" in part or any(s in part for s in separators) or size > _NAME_MAX:
        raise UnsafePath(f"path part {shown} must be one file name: not empty, '.' or '..', without "
                         f"'/' or NUL, at most {_NAME_MAX} bytes")
    return part
