"""`enqueue`: a JSON Lines file of envelopes into a queue's inbound, one bad line never blocking the rest.

The lines that are plainly valid are read together, straight from the file's bytes
(`storage.enqueue.parse_lines`; `parse_texts` for lines given as strings); every other line is
screened here, then checked one by one by `storage.enqueue.land`, which appends the valid ones in
one commit. Each refusal keeps its line number, its message id (when it has one) and the reason,
and the refused lines can be written beside the input so that nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.storage.enqueue import Parsed, land, parse_lines, parse_texts


@dataclass(frozen=True)
class Line:
    number: int
    raw: bytes


@dataclass(frozen=True)
class Refusal:
    line: Line
    message_id: object
    error: str


@dataclass(frozen=True)
class FileEnqueued:
    queue: str
    lines: int
    accepted: int
    batch_id: str | None
    refused: tuple[Refusal, ...]  # in line order


def split_lines(data: bytes) -> list[Line]:
    """The non-blank lines of a JSON Lines file, numbered from 1."""
    # Split on "\n" only, so line numbers match what an editor shows.
    return [Line(n, raw) for n, raw in enumerate(data.split(b"\n"), start=1) if raw.strip()]


def enqueue_lines(declaration: Declaration, queue: str, lines: list[Line],
                  now: datetime | None = None) -> FileEnqueued:
    """Enqueue the valid lines in one commit; every other line is refused with its reason."""
    by_number = {line.number: line for line in lines}
    raws = pa.array([line.raw for line in lines], pa.large_binary())
    numbers = np.array([line.number for line in lines], dtype=np.int64)
    parsed, left = parse_texts(raws, numbers, declaration.queue(queue).policy, now or datetime.now(UTC))
    return _enqueue(declaration, queue, parsed, numbers, left, by_number.__getitem__, now)


def enqueue_data(declaration: Declaration, queue: str, data: bytes, now: datetime | None = None) -> FileEnqueued:
    """`enqueue_lines` over the non-blank lines of a JSON Lines file's bytes, read where they lie: no
    Python object and no copy per line."""
    now = now or datetime.now(UTC)
    data, starts, ends, numbers = split_data(data)
    parsed, left = parse_lines(data, starts, ends, numbers, declaration.queue(queue).policy, now)

    def line_of(number: int) -> Line:
        i = int(np.searchsorted(numbers, number))
        return Line(number, data[starts[i]:ends[i]])

    return _enqueue(declaration, queue, parsed, numbers, left, line_of, now)


_WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)


def split_data(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """The file's bytes ending with a newline, where its non-blank lines (as `split_lines` finds
    them) start and end (at their newline), and their numbers."""
    if not data.endswith(b"\n"):
        data += b"\n"
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buffer == 0x0A)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    # bytes.strip() removes ASCII whitespace: a line with nothing else is blank. A line that starts
    # with anything else is not (nearly every line: an envelope starts with "{"); only the few
    # others are looked at whole, so the work follows the lines, not the bytes.
    doubtful = np.flatnonzero(np.isin(buffer[starts], _WHITESPACE))  # an empty line starts at its "\n"
    blank = [i for i in doubtful.tolist() if not data[starts[i]:ends[i]].strip()]
    kept = np.delete(np.arange(len(starts)), blank)
    return data, starts[kept], ends[kept], kept + 1


def _enqueue(declaration: Declaration, queue: str, parsed: Parsed, numbers: np.ndarray, left: np.ndarray,
             line_of: Callable[[int], Line], now: datetime | None) -> FileEnqueued:
    now = now or datetime.now(UTC)
    refused: list[Refusal] = []
    others: list[tuple[int, Any]] = []
    texts: dict[int, str] = {}
    for number in numbers[left].tolist():
        line = line_of(number)
        text, problem = _screen(line.raw)
        if text is None:
            refused.append(Refusal(line, None, problem or "refused"))
            continue
        others.append((number, text))
        texts[number] = text
    result = land(declaration, queue, parsed, others, lambda number: texts.get(number, ""), now)
    refused.extend(Refusal(line_of(r.line), r.message_id, r.error) for r in result.refused)
    refused.sort(key=lambda refusal: refusal.line.number)
    return FileEnqueued(queue, len(numbers), result.accepted, result.batch_id, tuple(refused))


def _screen(raw: bytes) -> tuple[str | None, str | None]:
    """The line as text, or why it cannot even be handed to `enqueue`: bytes that are not UTF-8.

    Everything else (JSON that does not read, nesting too deep, escaped lone surrogates, dates out
    of range) `land` refuses with the field and the rule, one line at a time.
    """
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as error:
        return None, (f"not valid UTF-8 at byte {error.start} (send binary bodies base64-encoded "
                            "in body_base64 with encoding 'binary')")


def refused_path(path: Path) -> Path:
    """`orders.jsonl` -> `orders.refused.jsonl`, beside the input; never the input itself."""
    stem = path.name.removesuffix(".jsonl")
    return path.with_name(f"{stem}.refused.jsonl")


def write_refused(target: Path, refused: tuple[Refusal, ...]) -> None:
    """Write the refused lines, as they were, to `target` (see `refused_path`); OSError if it cannot."""
    # A reader (or a re-run) never sees half a file of refused lines.
    partial = target.with_name(target.name + ".tmp")
    partial.write_bytes(b"".join(r.line.raw.rstrip(b"\r") + b"\n" for r in refused))
    partial.replace(target)
