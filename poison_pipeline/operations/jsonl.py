"""The lines of a JSON Lines buffer, found without a Python object per line."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The buffer is searched in chunks of this size on every core: a chunk's temporaries are reused by
# the next instead of being fresh pages the size of the file.
_CHUNK_BYTES = 16 << 20
_WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)


def newlines(buffer: np.ndarray) -> np.ndarray:
    """Where the buffer's newlines are, ascending (numpy releases the GIL: the chunks are searched
    on every core)."""
    chunks = max(1, len(buffer) // _CHUNK_BYTES)
    if chunks == 1:
        return np.flatnonzero(buffer == 0x0A)
    bounds = np.linspace(0, len(buffer), chunks + 1).astype(np.int64)

    def scan(span: tuple[int, int]) -> np.ndarray:
        return np.flatnonzero(buffer[span[0]:span[1]] == 0x0A) + span[0]

    with ThreadPoolExecutor(min(os.cpu_count() or 1, chunks)) as pool:
        return np.concatenate(list(pool.map(scan, zip(bounds[:-1], bounds[1:], strict=True))))


def split_data(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """The file's bytes ending with a newline, where its non-blank lines start and end (at their
    newline), and their numbers: lines split on "\\n" only and numbered from 1, as an editor shows
    them; a line of ASCII whitespace only (what `bytes.strip` removes) is blank."""
    if not data.endswith(b"\n"):
        data += b"\n"
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = newlines(buffer)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    # A line that starts with anything but whitespace is not blank (nearly every line: an envelope
    # starts with "{"); only the few others are looked at whole, so the work follows the lines.
    doubtful = np.flatnonzero(np.isin(buffer[starts], _WHITESPACE))  # an empty line starts at its "\n"
    blank = [i for i in doubtful.tolist() if not data[starts[i]:ends[i]].strip()]
    kept = np.delete(np.arange(len(starts)), blank)
    return data, starts[kept], ends[kept], kept + 1


def screen(raw: bytes) -> tuple[str | None, str | None]:
    """The line as text, or why it cannot even be handed to `parse_envelope`: bytes that are not UTF-8.

    Everything else (JSON that does not read, nesting too deep, escaped lone surrogates, dates out
    of range) the per-record path refuses with the field and the rule, one line at a time.
    """
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as error:
        return None, (f"not valid UTF-8 at byte {error.start} (send binary bodies base64-encoded "
                      "in body_base64 with encoding 'binary')")
