"""Delivering a batch to a batch handler, narrowing a failed batch down to the messages that fail."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from poison_pipeline.domain.envelope import Message
from poison_pipeline.domain.errors import Classifier
from poison_pipeline.domain.routing import Outcome
from poison_pipeline.engine.delivery import SUCCESS, AttemptRecord, Delivery, attempt, deliver

BatchHandler = Callable[[list[Message]], Any]


def deliver_batch(
    handler: BatchHandler,
    make_message: Callable[[int, int], Message],
    count: int,
    max_attempts: int,
    timeout: float | None,
    classifier: Classifier,
    rule_attempts: Sequence[int] = (),
) -> list[Delivery]:
    """Deliver messages 0..count-1 together; `make_message(i, attempt)` builds message i
    (`max_attempts`, `rule_attempts`: as `deliver`).

    A failed call is split in halves and each half tried again, down to single messages, which
    are then retried alone like any message. Only those single attempts are charged: a failed
    batch call says nothing about which of its messages failed, and a half that succeeds is never
    called again, so no side effect of a successful sub-batch happens twice.
    """
    results: list[Delivery | None] = [None] * count

    def single(message: Message) -> Any:
        return handler([message])

    def run(indices: list[int]) -> None:
        if len(indices) == 1:
            i = indices[0]
            results[i] = deliver(single, lambda attempt: make_message(i, attempt), max_attempts, timeout, classifier,
                                 rule_attempts=rule_attempts)
            return
        messages = [make_message(i, 1) for i in indices]
        started, duration, failure = attempt(handler, messages, timeout)
        if failure is not None:  # narrowed down below, then charged per message
            middle = len(indices) // 2
            run(indices[:middle])
            run(indices[middle:])
            return
        record: list[AttemptRecord] = [(1, started, duration, SUCCESS, None)]
        for i, message in zip(indices, messages, strict=True):
            results[i] = Delivery(Outcome.SUCCEEDED, record, 0, None, message.outbox)

    if count:
        run(list(range(count)))
    delivered = [r for r in results if r is not None]
    assert len(delivered) == count, "bisection covers every message"
    return delivered
