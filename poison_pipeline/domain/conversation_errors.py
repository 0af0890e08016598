"""Conversation error codes and descriptions (SPEC section 7, Service Broker's conversation errors).

Positive codes are the application's own; negative ones are system errors, grouped as Service
Broker groups them: recoverable ones may be resent on a new conversation, contract breaches never.
"""

from __future__ import annotations

RECOVERABLE = frozenset({-8489, -8462, -9719, -28052})
CONTRACT_BREACH = frozenset({-8494, -8490, -8425, -8408, -8428, -8498, -8430, -8457, -8437, -9616})
UNDEFINED = frozenset({-8470, -8469, -8487})
# Service Broker's END CONVERSATION WITH ERROR takes at most nvarchar(3000); so do we, which keeps
# notification rows small for the senders that read them.
MAX_DESCRIPTION = 3000
_INT64 = 2**63


class ConversationError(ValueError):
    """A request to end a conversation that cannot be carried out as asked; says what is wrong."""


def check_code(code: object) -> int:
    # bool is an int in Python, but `--code True` is never what an operator meant.
    if isinstance(code, bool) or not isinstance(code, int) or code == 0:
        raise ConversationError(
            f"code {code!r}: must be a non-zero integer (positive: application error, "
            "negative: system error)"
        )
    if not -_INT64 <= code < _INT64:
        raise ConversationError(f"code {code}: must fit in 64 bits")
    return code


def check_text(name: str, value: object, limit: int | None = None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConversationError(f"{name} {value!r}: must be non-empty text")
    if limit is not None and len(value) > limit:
        raise ConversationError(f"{name}: {len(value)} characters; at most {limit} are allowed")
    return value


def describe_code(code: int) -> str:
    """What kind of error a code is, as an operator reads it: `application error`, `system error
    (recoverable)`, `system error (contract breach)`, `system error (undefined)` or `system error`."""
    if code > 0:
        return "application error"
    for group, name in ((RECOVERABLE, "recoverable"), (CONTRACT_BREACH, "contract breach"),
                        (UNDEFINED, "undefined")):
        if code in group:
            return f"system error ({name})"
    return "system error"
