"""Processes that commit to one queue's inbound at once: enqueues, and deletes of taken batches as a
cycle makes them (run with the spawn start method: delta-rs's runtime does not survive a fork)."""

from __future__ import annotations

import json
from multiprocessing import Queue

from poison_pipeline.domain.declaration import parse_declaration
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import INBOUND, QueueTables
from poison_pipeline.storage.writer import queue_writer


def declaration(lake: str):
    return parse_declaration({"lake_root": lake, "queues": {"q": {"handler": "poison_pipeline_tests.handlers:accept"}}})


def enqueue_each(lake: str, prefix: str, count: int, errors: Queue) -> None:
    for i in range(count):
        try:
            enqueue(declaration(lake), "q", [json.dumps({"message_id": f"{prefix}{i}", "message_type": "t"})])
        except Exception as error:  # noqa: BLE001 - reported to the test, which fails on any
            errors.put(f"enqueue {prefix}{i}: {type(error).__name__}: {error}")


def delete_each(lake: str, batches: list[str], errors: Queue) -> None:
    tables = QueueTables.of(declaration(lake), "q")
    with queue_writer(tables, "inbound cycle") as writer:  # a cycle's deletes: under the queue's lease
        for batch in batches:
            try:
                writer.remove_batches(INBOUND, [batch])
            except Exception as error:  # noqa: BLE001
                errors.put(f"delete {batch}: {type(error).__name__}: {error}")
