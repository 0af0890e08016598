"""Error classification: which errors skip retries, and the signature that groups failures."""

from __future__ import annotations

import hashlib
import re
import traceback
from dataclasses import dataclass

from poison_pipeline.domain.imports import import_exception
from poison_pipeline.domain.policy import Unrecoverable

_NUMBERS = re.compile(r"\b\d+(\.\d+)?\b")
_HEX = re.compile(r"\b[0-9a-fA-F]{8,}(-[0-9a-fA-F]{4,})*\b")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


class HandlerTimeout(Exception):  # noqa: N818 - the name users see in the attempts ledger
    """The attempt ran longer than the queue's handler_timeout (WCF's transaction time-out)."""


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str
    stack: str
    signature: str
    code: str | None


def normalise(message: str) -> str:
    """A message with its variable parts (ids, numbers, quoted values) blanked, for grouping."""
    text = _HEX.sub("<id>", message)
    text = _QUOTED.sub("<str>", text)
    return _NUMBERS.sub("<n>", text)[:500]


# Formatting a stack reads source files and parses them for the caret markers: hundreds of
# microseconds. A poison message fails at the same place on every attempt, so the formatted frames
# are kept per failure site (the code objects and instruction offsets of the traceback).
_SITES: dict[tuple[object, ...], tuple[str, str]] = {}
_SITES_LIMIT = 4096


def _frames(error: BaseException) -> tuple[str, str]:
    """The formatted traceback header and frames, and the innermost frame as `file:function`."""
    key: list[object] = [type(error)]
    tb = error.__traceback__
    while tb is not None:
        key.append((tb.tb_frame.f_code, tb.tb_lasti))
        tb = tb.tb_next
    site = tuple(key)
    cached = _SITES.get(site)
    if cached is None:
        frames = traceback.extract_tb(error.__traceback__)
        top = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].name}" if frames else ""
        header = "Traceback (most recent call last):\n" if frames else ""
        cached = (header + "".join(frames.format()), top)
        if len(_SITES) >= _SITES_LIMIT:
            _SITES.clear()
        _SITES[site] = cached
    return cached


def _stack(error: BaseException, frames: str) -> str:
    if error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
        # A chained error prints its causes too; rare enough to format in full.
        return "".join(traceback.format_exception(error))
    return frames + "".join(traceback.format_exception_only(error))


def describe(error: BaseException) -> ErrorInfo:
    kind = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
    frames, top = _frames(error)
    message = str(error)[:4000]
    key = f"{kind}|{normalise(message)}|{top}"
    code = getattr(error, "code", None)
    return ErrorInfo(
        type=kind,
        message=message,
        stack=_stack(error, frames)[-8000:],
        signature=hashlib.sha1(key.encode()).hexdigest()[:16],
        code=None if code is None else str(code),
    )


class Classifier:
    """Decides whether an error is unrecoverable or points at an outage; built once per worker."""

    def __init__(self, rule: Unrecoverable, outage_errors: list[str] | None = None) -> None:
        self._types = tuple(import_exception(p) for p in rule.exceptions)
        self._codes = frozenset(rule.codes)
        self._outage = tuple(import_exception(p) for p in outage_errors or [])

    def unrecoverable(self, error: BaseException, info: ErrorInfo) -> bool:
        if self._types and isinstance(error, self._types):
            return True
        return info.code is not None and info.code in self._codes

    def outage(self, error: BaseException) -> bool:
        return bool(self._outage) and isinstance(error, self._outage)
