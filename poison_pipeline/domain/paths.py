"""What may name a folder or file of the lake: every lake path is the lake root joined with parts
that each pass this rule, so no queue name, table name or id can lead a path out of the root.

The rule is narrower than a file system's: a lake path is also a URL on object stores, where
`%2e%2e`, `?` or `#` would change the path the store resolves."""

from __future__ import annotations

import re

from poison_pipeline.domain.names import ReservedName, check_operator_id

SEGMENT_RULE = "letters, digits, '.', '_' and '-' (ASCII), not starting with '.' or '-'"
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
# Under a file name's 255 bytes, with room for what is added to an id (`<id>--undo`, `<id>--redrive`).
SEGMENT_MAX = 240
ID_MAX = 200


class UnsafeName(ValueError):
    """A name that cannot be one part of a lake path; the message names the rule."""


def segment(value: object, what: str, max_length: int = SEGMENT_MAX) -> str:
    """`value` when it can be one part of a lake path, else UnsafeName naming `what` and the rule."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value) or len(value) > max_length:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise UnsafeName(f"{what} {shown} cannot name a folder of the lake: use 1 to {max_length} "
                         f"{SEGMENT_RULE}")
    return value


def lake_path(root: str, *parts: str) -> str:
    """`root`/`parts`..., each part checked: the result stays under `root`."""
    return "/".join((root, *(segment(part, "a lake path part") for part in parts)))


def operator_id(value: str | None, error: type[ValueError] = UnsafeName, what: str = "--id") -> str | None:
    """An id an operator gives a new action (None: let the operation derive one), checked as a lake
    path part and as one no name the product derives can equal (domain/names.py): `error` (the
    operation's own refusal) names the rule. Every request checks its id with it."""
    try:
        return None if value is None else check_operator_id(segment(value, what, ID_MAX), what)
    except (UnsafeName, ReservedName) as unsafe:
        raise error(str(unsafe)) from None


def action_id_part(value: str | None, error: type[ValueError] = UnsafeName, what: str = "--id") -> str | None:
    """An id an operation is run under: an operator's, checked by its request, or one the product
    derived (`<id>--<table>`, a ramp's step) or recorded (a completion of an interrupted action, maybe
    named by an earlier version): checked as a lake path part only."""
    try:
        return None if value is None else segment(value, what, ID_MAX)
    except UnsafeName as unsafe:
        raise error(str(unsafe)) from None
