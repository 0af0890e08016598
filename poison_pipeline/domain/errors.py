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


def describe(error: BaseException) -> ErrorInfo:
    kind = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
    frames = traceback.extract_tb(error.__traceback__)
    top = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].name}" if frames else ""
    message = str(error)[:4000]
    key = f"{kind}|{normalise(message)}|{top}"
    code = getattr(error, "code", None)
    return ErrorInfo(
        type=kind,
        message=message,
        stack="".join(traceback.format_exception(error))[-8000:],
        signature=hashlib.sha1(key.encode()).hexdigest()[:16],
        code=None if code is None else str(code),
    )


class Classifier:
    """Decides whether an error is unrecoverable; built once per worker from the policy."""

    def __init__(self, rule: Unrecoverable) -> None:
        self._types = tuple(import_exception(p) for p in rule.exceptions)
        self._codes = frozenset(rule.codes)

    def unrecoverable(self, error: BaseException, info: ErrorInfo) -> bool:
        if self._types and isinstance(error, self._types):
            return True
        return info.code is not None and info.code in self._codes
