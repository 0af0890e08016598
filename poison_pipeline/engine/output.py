"""What a handler prints, bounded per attempt.

A worker's stdout and stderr end up in the driver's own (a small cycle's worker inherits them; a
Spark executor's Python worker writes to the executor's log, on one machine the driver's stderr),
which a Dagster run keeps as its compute logs. A handler that writes gigabytes there would fill
a disk (and the memory of whatever reads those logs). So while an attempt runs, `sys.stdout` and
`sys.stderr` pass on the first LIMIT characters (bytes, through `.buffer`) it writes to each, then
drop the rest with one line saying so. Output written below Python (`os.write(1, ...)`, a C
library's printf) is not seen here.
"""

from __future__ import annotations

import sys
from typing import Any

LIMIT = 1 << 20


class _Attempt:
    """The attempt running now: its label (a message, or a list of them; None between attempts),
    and what each stream has left for `counted`, the attempt that wrote last."""

    def __init__(self) -> None:
        self.label: Any = None
        self.counted: Any = None
        self.left = {"stdout": LIMIT, "stderr": LIMIT}


_attempt = _Attempt()


# An attempt's budget is set when it first writes, not here: most attempts write nothing, and
# these two run around every one of them.
def begin(label: Any) -> None:
    _attempt.label = label


def end() -> None:
    _attempt.label = None


def _describe(label: Any) -> str:
    if isinstance(label, list):
        first = getattr(label[0], "message_id", "?") if label else "?"
        return f"a batch of {len(label)} message(s) from {first!r}"
    return f"message {getattr(label, 'message_id', '?')!r}, attempt {getattr(label, 'attempt', '?')}"


class _Capped:
    """A stream (text, or its binary `buffer`) that passes on what the attempt has left, if anything."""

    def __init__(self, raw: Any, name: str, text: bool = True) -> None:
        self._raw = raw
        self._name = name
        self._text = text

    def write(self, data: Any) -> int:
        if _attempt.label is None:  # between attempts: the worker's own output
            return self._raw.write(data)
        if _attempt.counted is not _attempt.label:  # the attempt's first write
            _attempt.counted = _attempt.label
            _attempt.left = {"stdout": LIMIT, "stderr": LIMIT}
        size = len(data)
        left = _attempt.left[self._name]
        if size <= left:
            _attempt.left[self._name] = left - size
            return self._raw.write(data)
        if left > 0:
            self._raw.write(data[:left])
            notice = (f"\n[poison_pipeline] the handler wrote more than {LIMIT} characters to {self._name} in "
                      f"{_describe(_attempt.label)}: the rest of this attempt's {self._name} is dropped\n")
            self._raw.write(notice if self._text else notice.encode())
            self._raw.flush()
        _attempt.left[self._name] = 0
        return size  # as if written: a handler that checks sees its write succeed

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> _Capped:
        return _Capped(self._raw.buffer, self._name, text=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def install() -> None:
    """Bound this process's stdout and stderr (once; a Spark worker runs many tasks)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Capped):
            setattr(sys, name, _Capped(stream, name))
