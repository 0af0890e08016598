"""What handler code imports: the declaration of a handler that takes a whole batch at once."""

from __future__ import annotations

from collections.abc import Callable
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
