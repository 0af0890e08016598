"""Error classification: which errors skip retries, and the signature that groups failures."""

from __future__ import annotations

import hashlib
import re
import sysconfig
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from poison_pipeline.domain.imports import import_exception
from poison_pipeline.domain.policy import Rule, Unrecoverable

_NUMBERS = re.compile(r"\b\d+(\.\d+)?\b")
_HEX = re.compile(r"\b[0-9a-fA-F]{8,}(-[0-9a-fA-F]{4,})*\b")
_QUOTED = re.compile(r"(?<!\w)'[^']*'|\"[^\"]*\"")
# Errors whose whole message is one quoted key (see normalise).
_KEYED = frozenset({"KeyError"})
# A word with a digit in it, left once the numbers are blanked: an id such as ORD1234, 0xff, a1b2c3.
_WITH_DIGIT = re.compile(r"\b\w*\d\w*\b")


class HandlerTimeout(Exception):  # noqa: N818 - the name users see in the attempts ledger
    """The attempt ran longer than the queue's handler_timeout (WCF's transaction time-out)."""


@dataclass(frozen=True)
class ErrorInfo:
    type: str
    message: str
    stack: str
    signature: str
    code: str | None


def normalise(message: str, error_type: str | None = None) -> str:
    """A message with its variable parts blanked, for grouping: quoted values become <str>, hex ids
    (8+ hex digits, UUIDs) and words with a digit in them <id>, numbers <n>. A KeyError's message is
    the missing key alone, which names the bug (a field the handler expects), so its quotes stay."""
    text = _HEX.sub("<id>", message)
    if not (error_type in _KEYED and _QUOTED.fullmatch(text)):
        text = _QUOTED.sub("<str>", text)
    text = _NUMBERS.sub("<n>", text)
    return _WITH_DIGIT.sub("<id>", text)[:500]


def signature_of(kind: str, normalised: str, top_frame: str) -> str:
    """The signature of a failure: 16 hex digits of sha1(type|normalised message|top frame)."""
    return hashlib.sha1(f"{kind}|{normalised}|{top_frame}".encode()).hexdigest()[:16]


# Failure groups (the `groups` command, and the cycles that count what they failed per group).
GROUP_ID_LENGTH = 8
NO_ERROR = "no-error:"
NO_VALUE = "(none)"
_HEX_SIGNATURE = re.compile(r"[0-9a-f]{16}")


def group_key(signature: str | None, reason: str | None) -> str:
    """What a failed row is grouped by: its error signature, or `no-error:<reason>` without an error."""
    return signature if signature is not None else NO_ERROR + (reason or NO_VALUE)


def group_id(key: str) -> str:
    """The 8-character id of a group key: a signature's first 8 hex digits, else sha1 of the key's."""
    if _HEX_SIGNATURE.fullmatch(key):
        return key[:GROUP_ID_LENGTH]
    return hashlib.sha1(key.encode()).hexdigest()[:GROUP_ID_LENGTH]


# Whose code a frame is. The signature's top frame is the innermost frame of the handler's own code,
# not the library the handler called (json, a DB driver), which says where the error surfaced, not
# which bug it is, nor the pipeline's engine that called the handler (a timeout is raised there).
_ENGINE = "poison_pipeline"
_APPLICATION_IN_ENGINE = "poison_pipeline.examples"  # the demo's handlers are application code
_STDLIB_DIRS = tuple(sorted({sysconfig.get_paths()[k].rstrip("/\\") + "/" for k in ("stdlib", "platstdlib")}))
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")


def handler_package(handler: str | None) -> str | None:
    """The top-level package of a declared handler (`myapp.handlers:withdraw` -> `myapp`)."""
    if not handler:
        return None
    return handler.partition(":")[0].partition(".")[0] or None


def is_handler_code(module: str, filename: str, own_package: str | None = None) -> bool:
    """Whether a frame (its module's `__name__` and file) belongs to the handler's own code.

    Not the standard library, not poison_pipeline's engine (its `examples` are application code),
    not installed libraries (site-packages, dist-packages), except the handler's own package
    (`own_package`), which an installed application lives in too."""
    top = module.partition(".")[0]
    if top == _ENGINE and module != _APPLICATION_IN_ENGINE and not module.startswith(_APPLICATION_IN_ENGINE + "."):
        return False
    if own_package is not None and top == own_package:
        return True
    # "<frozen importlib._bootstrap>", "<string>": no file of the handler's.
    if filename.startswith("<") or _INSTALLED.search(filename):
        return False
    return not filename.startswith(_STDLIB_DIRS)


def frame_name(filename: str, function: str) -> str:
    """How a frame appears in a signature: `handlers.py:withdraw_inventory` (no line number, so an
    edit elsewhere in the file keeps the group)."""
    return f"{filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{function}"


# Formatting a stack reads source files and parses them for the caret markers: hundreds of
# microseconds. A poison message fails at the same place on every attempt, so the formatted frames
# are kept per failure site (the code objects and instruction offsets of the traceback).
_SITES: dict[tuple[object, ...], tuple[str, str]] = {}
_SITES_LIMIT = 4096


def _top_frame(error: BaseException, own_package: str | None) -> str:
    """The innermost frame of the handler's own code as `file:function`; the innermost frame of all
    when none is (the handler's code is not on the stack), "" without a traceback."""
    innermost, own = "", ""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        innermost = frame_name(code.co_filename, code.co_name)
        if is_handler_code(str(tb.tb_frame.f_globals.get("__name__", "")), code.co_filename, own_package):
            own = innermost
        tb = tb.tb_next
    return own or innermost


def _frames(error: BaseException, own_package: str | None = None) -> tuple[tuple[object, ...], str, str]:
    """The failure site (the key of the caches), the formatted traceback header and frames, and the
    top frame of the handler's code."""
    key: list[object] = [type(error), own_package]
    tb = error.__traceback__
    while tb is not None:
        key.append((tb.tb_frame.f_code, tb.tb_lasti))
        tb = tb.tb_next
    site = tuple(key)
    cached = _SITES.get(site)
    if cached is None:
        frames = traceback.extract_tb(error.__traceback__)
        top = _top_frame(error, own_package)
        header = "Traceback (most recent call last):\n" if frames else ""
        cached = (header + "".join(frames.format()), top)
        if len(_SITES) >= _SITES_LIMIT:
            _SITES.clear()
        _SITES[site] = cached
    return site, *cached


def _safe_str(value: object) -> str:
    """str() of what a handler raised, which runs the handler's code: when that fails, what the
    traceback module prints instead, so that the attempt is still described and charged."""
    try:
        return str(value)
    except BaseException:  # noqa: BLE001 - any failure of the handler's __str__
        return "<exception str() failed>"


def _exception_line(error: BaseException, text: str) -> str:
    """What `traceback.format_exception_only` gives for `error` (whose str() is `text`), built
    directly in the common case: that function builds a TracebackException, several times the
    cost of the line."""
    kind = type(error)
    module = kind.__module__
    if issubclass(kind, SyntaxError) or getattr(error, "__notes__", None) is not None or not isinstance(module, str):
        return "".join(traceback.format_exception_only(error))
    name = kind.__qualname__ if module in ("__main__", "builtins") else f"{module}.{kind.__qualname__}"
    return f"{name}: {text}\n" if text else f"{name}\n"


def _chained(error: BaseException) -> bool:
    return error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__)


def _stack(error: BaseException, frames: str, text: str) -> str:
    if _chained(error):
        # A chained error prints its causes too; rare enough to format in full.
        return "".join(traceback.format_exception(error))
    return frames + _exception_line(error, text)


# A poison message fails the same way on each of its attempts: its description is kept per failure
# site, text and code, so that only its first attempt pays for the message's normalisation.
_DESCRIBED: dict[tuple[object, ...], ErrorInfo] = {}
_DESCRIBED_LIMIT = 4096


def describe(error: BaseException, own_package: str | None = None) -> ErrorInfo:
    """Type, message, stack and signature of a failed attempt. The signature groups failures (the
    `groups` command): type, message with its variable parts blanked (`normalise`), and the
    innermost frame of the handler's own code (`is_handler_code`; `own_package` is the handler's
    top-level package, see `handler_package`). Cheap: frames are formatted once per failure site."""
    site, frames, top = _frames(error, own_package)
    text = _safe_str(error)
    try:
        code = getattr(error, "code", None)
    except BaseException:  # noqa: BLE001 - a broken `code` property is no code
        code = None
    code_text = None if code is None else _safe_str(code)
    # A chained error's stack shows its causes and a note shows in it, neither of which the site
    # and text capture: those are described afresh each time.
    cacheable = not _chained(error) and getattr(error, "__notes__", None) is None
    key = (site, text, code_text)
    if cacheable:
        cached = _DESCRIBED.get(key)
        if cached is not None:
            return cached
    kind = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
    message = text[:4000]
    info = ErrorInfo(
        type=kind,
        message=message,
        stack=_stack(error, frames, text)[-8000:],
        signature=signature_of(kind, normalise(message, kind), top),
        code=code_text,
    )
    if cacheable:
        if len(_DESCRIBED) >= _DESCRIBED_LIMIT:
            _DESCRIBED.clear()
        _DESCRIBED[key] = info
    return info


class Classifier:
    """Decides whether an error is unrecoverable, points at an outage, or which retry rule it
    falls under; built once per worker."""

    def __init__(self, rule: Unrecoverable, outage_errors: list[str] | None = None,
                 handler: str | None = None, rules: Sequence[Rule] = ()) -> None:
        self._types = tuple(import_exception(p) for p in rule.exceptions)
        self._codes = frozenset(rule.codes)
        self._outage = tuple(import_exception(p) for p in outage_errors or [])
        self._own_package = handler_package(handler)
        self._rules = [(tuple(import_exception(p) for p in r.exceptions), frozenset(r.codes)) for r in rules]

    def describe(self, error: BaseException) -> ErrorInfo:
        """`describe`, with the declared handler's package counted as its own code."""
        return describe(error, self._own_package)

    def unrecoverable(self, error: BaseException, info: ErrorInfo) -> bool:
        if self._types and isinstance(error, self._types):
            return True
        return info.code is not None and info.code in self._codes

    def outage(self, error: BaseException) -> bool:
        return bool(self._outage) and isinstance(error, self._outage)

    def rule(self, error: BaseException | None, info: ErrorInfo) -> int | None:
        """The number of the first retry rule that matches the error (None: none does). `error` is
        None when only its description is left (a worker it killed): then codes alone match."""
        for number, (types, codes) in enumerate(self._rules):
            if (types and error is not None and isinstance(error, types)) or (
                    info.code is not None and info.code in codes):
                return number
        return None


class RecordedClassifier:
    """`Classifier`'s decisions for an error known only by what the attempts ledger recorded: its
    type's name (`module.Qualname`) and its code. The type is imported again when it can be, so that
    subclasses match as they do live; a type that cannot be imported matches by its name only."""

    def __init__(self, rule: Unrecoverable, rules: Sequence[Rule] = ()) -> None:
        self._unrecoverable = _Named(rule.exceptions, rule.codes)
        self._rules = [_Named(r.exceptions, r.codes) for r in rules]
        self._types: dict[str, type[BaseException] | None] = {}

    def unrecoverable(self, type_name: str | None, code: str | None) -> bool:
        return self._unrecoverable.matches(self._type(type_name), type_name, code)

    def rule(self, type_name: str | None, code: str | None) -> int | None:
        kind = self._type(type_name)
        for number, named in enumerate(self._rules):
            if named.matches(kind, type_name, code):
                return number
        return None

    def _type(self, name: str | None) -> type[BaseException] | None:
        if name is None:
            return None
        if name not in self._types:
            self._types[name] = _recorded_type(name)
        return self._types[name]


class _Named:
    def __init__(self, paths: Sequence[str], codes: Sequence[str]) -> None:
        self.types = tuple(import_exception(p) for p in paths)
        self.names = frozenset(p.replace(":", ".") for p in paths)
        self.codes = frozenset(codes)

    def matches(self, kind: type[BaseException] | None, name: str | None, code: str | None) -> bool:
        if code is not None and code in self.codes:
            return True
        if kind is not None:
            return issubclass(kind, self.types) if self.types else False
        return name is not None and name in self.names


def _recorded_type(name: str) -> type[BaseException] | None:
    """The exception class a recorded type name (`describe`'s `type`) names, if it can be imported."""
    parts = name.split(".")
    candidates = [f"{'.'.join(parts[:i])}:{'.'.join(parts[i:])}" for i in range(len(parts) - 1, 0, -1)]
    for path in candidates if len(parts) > 1 else [name]:
        try:
            return import_exception(path)
        except ValueError:
            continue
    return None
