"""Helpers the tests share: enqueue scripted messages, and find every place a message is."""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import PROCESSED
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import ATTEMPTS, QueueTables
from poison_pipeline.storage.writer import queue_writer

HANDLER = "poison_pipeline_tests.handlers:scripted"


def kill_seed() -> int:
    """The seed of every kill campaign's draws: $KILL_SEED, 1 unless set, so `make test` draws the same
    points every run (it fails for a change, not for a draw) and `KILL_SEED=N` draws others; the
    test run's header prints it (conftest.py)."""
    return int(os.environ.get("KILL_SEED", "1"))


def kill_sample(points: Sequence[tuple[str, int]], per_group: int) -> list[Any]:
    """`points` as pytest parameters: `per_group` of each group's points (the first item names the
    group), drawn with `kill_seed()`, run by `make test`; the others are marked `full`, run by
    `make test-all` only. Every group keeps a kill in the quick run, and the draw is the same in
    every pytest-xdist worker (the seed is), so they collect the same tests."""
    import pytest

    groups: dict[Hashable, list[tuple[str, int]]] = defaultdict(list)
    for point in points:
        groups[point[0]].append(point)
    rng = random.Random(kill_seed())
    drawn = {p for group in groups.values() for p in rng.sample(group, min(per_group, len(group)))}
    return [pytest.param(*p, id=f"{p[0]}-{p[1]}", marks=() if p in drawn else pytest.mark.full) for p in points]


def queue(**policy: Any) -> dict[str, Any]:
    base = {"receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0}
    return {"q": {"handler": HANDLER, "policy": {**base, **policy}}}


def send(declaration: Declaration, bodies: dict[str, dict[str, Any]], **extra: Any) -> None:
    records = [{"message_id": mid, "message_type": "test", "body": body, **extra}
               for mid, body in bodies.items()]
    result = enqueue(declaration, "q", records)
    assert not result.refused, result.refused


def seed(tables: QueueTables, table: str, data: Any, **options: Any) -> bool:
    """Append `data` to `table` as the holder of the queue's lease would (a test's rows, put in place)."""
    with queue_writer(tables, "test", run_id="test-seed") as writer:
        return writer.append(table, data, **options)


def rows(declaration: Declaration, table: str, name: str = "q") -> list[dict[str, Any]]:
    return QueueTables.of(declaration, name).open(table).to_pyarrow_table().to_pylist()


def places(declaration: Declaration, name: str = "q") -> dict[str, list[str]]:
    """message id -> every table (or ledger disposition) it is found in."""
    tables = QueueTables.of(declaration, name)
    found: dict[str, list[str]] = defaultdict(list)
    for table in (*tables.waiting, "dead_letter", "quarantine"):
        for row in rows(declaration, table, name):
            found[row["message_id"]].append(table)
    for row in rows(declaration, PROCESSED, name):
        found[row["message_id"]].append(f"processed:{row['disposition']}")
    return dict(found)


def table_versions(declaration: Declaration) -> dict[str, int]:
    versions = {}
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        for table in tables.all_tables:
            if tables.exists(table):
                versions[f"{queue}/{table}"] = tables.open(table).version()
    return versions


def attempts_of(declaration: Declaration, message_id: str, name: str = "q") -> list[dict[str, Any]]:
    return sorted(
        (r for r in rows(declaration, ATTEMPTS, name) if r["message_id"] == message_id),
        key=lambda r: (r["cycle"], r["attempt"]),
    )


def at_step(monkeypatch: Any, steps: Sequence[tuple[object, str]], n: int,
            action: Callable[[int], None]) -> list[str]:
    """Call `action(n)` just before the n-th call, counted across `steps` (pairs of an owner and the
    name of a durable step on it: a journal write, a table commit, a delete). An action that raises
    stops that step from happening (a crash, a storage fault). Returns the steps called, in order."""
    called: list[str] = []

    def wrap(owner: object, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            called.append(f"{getattr(owner, '__name__', owner)}.{name}")
            if len(called) == n:
                action(n)
            return function(*args, **kwargs)
        return step

    for owner, name in steps:
        monkeypatch.setattr(owner, name, wrap(owner, name, getattr(owner, name)))
    return called
