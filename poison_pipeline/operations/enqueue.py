"""`enqueue`: a JSON Lines file of envelopes into a queue's inbound, one bad line never blocking the rest.

The lines that are plainly valid are read together, straight from the file's bytes
(`operations.records.land_data`, which the Python API's `enqueue` of a path or bytes runs too;
`parse_texts` for lines given one by one); every other line is checked one by one by
`operations.records.land_lines`, which appends the valid ones in one commit. Each refusal keeps its
line number, its message id (when it has one) and the reason, and the refused lines can be
written beside the input, with their reasons in a file of their own, so that nothing is lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.operations.records import EnqueueResult, RawOf, land_data, land_lines, parse_texts


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
    now = now or datetime.now(UTC)
    by_number = {line.number: line for line in lines}
    raws = pa.array([line.raw for line in lines], pa.large_binary())
    numbers = np.array([line.number for line in lines], dtype=np.int64)
    parsed, left = parse_texts(raws, numbers, declaration.queue(queue).policy, now)

    def raw_of(number: int) -> bytes:
        return by_number[number].raw

    result = land_lines(declaration, queue, parsed, numbers, left, raw_of, now)
    return _file_enqueued(queue, len(lines), result, raw_of)


def enqueue_data(declaration: Declaration, queue: str, data: bytes, now: datetime | None = None) -> FileEnqueued:
    """`enqueue_lines` over the non-blank lines of a JSON Lines file's bytes, read where they lie: no
    Python object and no copy per line."""
    result, lines, raw_of = land_data(declaration, queue, data, now or datetime.now(UTC))
    return _file_enqueued(queue, lines, result, raw_of)


def _file_enqueued(queue: str, lines: int, result: EnqueueResult, raw_of: RawOf) -> FileEnqueued:
    refused = tuple(Refusal(Line(r.line, raw_of(r.line)), r.message_id, r.error) for r in result.refused)
    return FileEnqueued(queue, lines, result.accepted, result.batch_id, refused)


def refused_path(path: Path) -> Path:
    """`orders.jsonl` -> `orders.refused.jsonl`, beside the input; never the input itself."""
    stem = path.name.removesuffix(".jsonl")
    return path.with_name(f"{stem}.refused.jsonl")


def reasons_path(refused: Path) -> Path:
    """`orders.refused.jsonl` -> `orders.refused.reasons.jsonl`: why each of its lines was refused."""
    return refused.with_name(f"{refused.name.removesuffix('.jsonl')}.reasons.jsonl")


def reason_lines(refused: tuple[Refusal, ...]) -> bytes:
    """One JSON object per refused line, in the same order: the line's number in the input and in
    the refused file, its message id (null when it has none) and the reason."""
    return b"".join(json.dumps({"line": r.line.number, "refused_line": n, "message_id": r.message_id,
                                "reason": r.error}, default=str).encode("ascii") + b"\n"
                    for n, r in enumerate(refused, start=1))


def write_refused(target: Path, refused: tuple[Refusal, ...]) -> None:
    """Write the refused lines, as they were (so that, fixed, the file can be enqueued again), to
    `target` (see `refused_path`) and their reasons beside it (`reasons_path`); OSError if it cannot."""
    # A reader (or a re-run) never sees half a file.
    for path, data in ((reasons_path(target), reason_lines(refused)),
                       (target, b"".join(r.line.raw.rstrip(b"\r") + b"\n" for r in refused))):
        partial = path.with_name(path.name + ".tmp")
        partial.write_bytes(data)
        partial.replace(path)
