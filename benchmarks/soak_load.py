"""The soak's traffic: small batches of the demo's messages every few seconds, each batch with ids,
conversations and users of its own, so that nothing repeats across batches."""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from deltalake.exceptions import CommitFailedError

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.examples.generate import (
    account_messages,
    checkout_messages,
    inventory_messages,
    order_messages,
    presentation_messages,
)
from poison_pipeline.operations.records import EnqueueResult, enqueue

# A conversation's lifetime for checkout's shipments: long enough that none expires in the soak
# (expiry and resends are the demo's scenario, not load).
SHIPMENT_LIFETIME_S = 3600.0


def _own(records: list[dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """The records with their ids, conversations and users made this batch's."""
    tag = f"b{batch:05d}"
    for record in records:
        record["message_id"] = f"{tag}-{record['message_id']}"
        if record.get("conversation_id"):
            record["conversation_id"] = f"{tag}-{record['conversation_id']}"
        body = record.get("body")
        if isinstance(body, dict) and "user" in body:
            body["user"] = f"{tag}-{body['user']}"
        if isinstance(body, dict) and "order" in body:
            body["order"] = batch * 1000 + body["order"]  # checkout's shipment conversation is named by it
    return records


def batch_of(queue: str, batch: int, rng: random.Random) -> list[dict[str, Any]]:
    """One batch for `queue`, with the demo's mix: poison (obsolete parts, profiles that never come,
    a slide of an invalid format, a recalled item), transient failures (deadlock victims, profiles
    that arrive by the first retry cycle) and conversations (accounts, presentations, shipments)."""
    if queue == "inventory":
        return inventory_messages(12, rng, prefix=f"b{batch:05d}-inv")
    if queue == "orders":
        return _own(order_messages(8, datetime.now(UTC), rng), batch)
    if queue == "accounts":
        return _own(account_messages(2, rng), batch)
    if queue == "presentations":  # one presentation of 5 slides every other batch, a broken one in 4
        return _own(presentation_messages(1, broken=1 if batch % 8 == 0 else 0), batch) if batch % 2 == 0 else []
    if queue == "checkout":  # an order every other batch, one in 5 with a recalled item
        return _own(checkout_messages(1, SHIPMENT_LIFETIME_S, recalled=0 if batch % 10 == 1 else -1), batch) \
            if batch % 2 == 1 else []
    return []  # shipping: fed by checkout only


class Producer(threading.Thread):
    """Enqueues a batch to every fed queue each `interval` seconds until stopped; counts what each
    queue accepted. An enqueue that fails stops the producer and is re-raised by `join_checked`."""

    def __init__(self, declaration: Declaration, interval: float, seed: int) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.declaration = declaration
        self.interval = interval
        self.rng = random.Random(seed)
        self.stopped = threading.Event()
        self.enqueued: Counter[str] = Counter()
        self.batches = 0
        self.error: BaseException | None = None
        self.conflicts = 0

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                for queue in self.declaration.queues:
                    records = batch_of(queue, self.batches, self.rng)
                    if records:
                        result = self._enqueue(queue, records)
                        if result.refused:
                            raise RuntimeError(f"{queue}: the producer's messages were refused: {result.refused[:3]}")
                        self.enqueued[queue] += result.accepted
                self.batches += 1
                self.stopped.wait(self.interval)
        except BaseException as error:  # noqa: BLE001 - handed to the soak's thread by join_checked
            self.error = error

    def _enqueue(self, queue: str, records: list[dict[str, Any]]) -> EnqueueResult:
        """Enqueue; again when the inbound append lost a commit race to a cycle's delete (delta-rs
        refuses it: "a concurrent transaction deleted data this operation read"). A failed commit
        wrote nothing, so trying again cannot enqueue twice; each such retry is counted."""
        for _ in range(10):
            try:
                return enqueue(self.declaration, queue, records)
            except CommitFailedError:
                self.conflicts += 1
                self.stopped.wait(0.2)
        return enqueue(self.declaration, queue, records)

    def join_checked(self) -> None:
        self.stopped.set()
        self.join()
        if self.error is not None:
            raise RuntimeError("the producer failed") from self.error
