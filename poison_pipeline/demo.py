"""`make demo`: 100,000 messages through the example queues, every cycle launched by its sensor,
then the Service Broker scenarios (conversations in order, an outage, a resend) and an operator
scene (failure groups, a cut-off, a dry run, a ramped redrive after a fix)."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import DagsterInstance

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.examples import scenarios
from poison_pipeline.examples.drive import Driver
from poison_pipeline.examples.generate import inventory_messages, order_messages
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import QueueTables


def shortened(declaration: Declaration, lake_root: Path, delay: timedelta) -> Declaration:
    """The declaration with its own lake and retry-cycle delays short enough to watch."""
    queues = {}
    for name, queue in declaration.queues.items():
        policy = queue.policy.model_copy(update={"retry_cycle_delay": delay})
        queues[name] = queue.model_copy(update={"policy": policy})
    return declaration.model_copy(update={"lake_root": str(lake_root.resolve()), "queues": queues})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None, help="declaration file (default: poison_pipeline.yaml)")
    parser.add_argument("--lake", default="demo_lake", help="a fresh lake root for the demo")
    parser.add_argument("--inventory", type=int, default=60_000, help="inventory withdrawals")
    parser.add_argument("--orders", type=int, default=40_000, help="purchase orders")
    parser.add_argument("--delay", type=float, default=3.0, help="retry_cycle_delay in seconds")
    args = parser.parse_args(argv)
    started = time.monotonic()
    lake = Path(args.lake)
    shutil.rmtree(lake, ignore_errors=True)
    # The handlers' "application database"; set before Spark starts so its workers inherit it.
    os.environ["POISON_PIPELINE_APP_DB"] = str((lake / "app_db").resolve())
    declaration = shortened(load_declaration(args.config), lake, timedelta(seconds=args.delay))
    rng, now = random.Random(7), datetime.now(UTC)
    received: Counter[str] = Counter({
        "inventory": enqueue(declaration, "inventory", inventory_messages(args.inventory, rng)).accepted,
        "orders": enqueue(declaration, "orders", order_messages(args.orders, now, rng)).accepted,
    })
    for queue, count in received.items():
        print(f"enqueued {count} messages to {queue}")
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        driver = Driver(defs, instance)
        runs = driver.drive()
        print(f"\n{runs} Dagster runs launched by the sensors in {time.monotonic() - started:.0f}s")
        stories = {
            "conversations": scenarios.conversations(declaration, driver, received),
            "outage": scenarios.outage(declaration, driver, received),
            "resend": scenarios.resend(declaration, driver, received),
            "operator": scenarios.operator(declaration, driver, received),
        }
    print(f"\nall done in {time.monotonic() - started:.0f}s\n")
    for story, checks in stories.items():
        verdict = f"OK ({checks.made} claims)" if checks.passed else (
            f"NOT AS EXPECTED ({len(checks.failed)} of {checks.made} claims failed)")
        print(f"scenario {story}: {verdict}")
        for claim in checks.failed:
            print(f"  MISMATCH: {claim}")
    unbalanced = []
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        line = conservation(tables)
        if line.accounted != received[queue]:
            unbalanced.append(queue)
        counts = "  ".join(f"{t}={tables.open(t).count()}" for t in tables.all_tables if tables.exists(t))
        print(f"\n{queue}: {counts}\n  " + line.line(received=received[queue]))
    failed = [story for story, checks in stories.items() if not checks.passed]
    if failed or unbalanced:
        print(f"\nTHE DEMO FAILED: scenarios not as expected: {', '.join(failed) or 'none'}; "
              f"conservation mismatch: {', '.join(unbalanced) or 'none'}")
        return 1
    print("\nevery check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
