"""`make demo`: 100,000 messages through the example queues, every cycle launched by its sensor."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import DagsterInstance, Definitions, SensorResult, build_sensor_context

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.examples.generate import inventory_messages, order_messages
from poison_pipeline.ops.conservation import conservation
from poison_pipeline.storage.enqueue import enqueue
from poison_pipeline.storage.tables import QueueTables

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def shortened(declaration: Declaration, lake_root: Path, delay: timedelta) -> Declaration:
    """The declaration with its own lake and retry-cycle delays short enough to watch."""
    queues = {}
    for name, queue in declaration.queues.items():
        policy = queue.policy.model_copy(update={"retry_cycle_delay": delay})
        queues[name] = queue.model_copy(update={"policy": policy})
    return declaration.model_copy(update={"lake_root": str(lake_root.resolve()), "queues": queues})


def drive(defs: Definitions, instance: DagsterInstance, deadline: float) -> int:
    """Evaluate every sensor and run what it requests, until nothing waits or the deadline passes."""
    cursors: dict[str, str | None] = {}
    runs = 0
    sensors = list(defs.get_repository_def().sensor_defs)
    while time.monotonic() < deadline:
        launched, waiting = 0, False
        for sensor in sensors:
            context = build_sensor_context(instance=instance, cursor=cursors.get(sensor.name),
                                           definitions=defs, sensor_name=sensor.name)
            result = sensor(context)
            assert isinstance(result, SensorResult)
            cursors[sensor.name] = result.cursor
            waiting = waiting or bool(json.loads(result.cursor or "{}").get("waiting"))
            for request in result.run_requests or []:
                job = defs.resolve_job_def(sensor.job_name)
                outcome = job.execute_in_process(instance=instance, tags=request.tags,
                                                 run_config=QUIET)
                assert outcome.success, f"{sensor.job_name} failed"
                launched += 1
                for event in outcome.get_asset_materialization_events():
                    materialization = event.step_materialization_data.materialization
                    meta = {k: v.value for k, v in materialization.metadata.items()}
                    print(f"  {materialization.asset_key.to_user_string():<22} "
                          f"messages={meta.get('messages', 0):>6} attempts={meta.get('attempts', 0):>6} "
                          f"processed={meta.get('processed', 0):>6} moved={meta.get('moved', 0):>5} "
                          f"{meta.get('duration_s', 0):6.1f}s")
        runs += launched
        if not launched and not waiting:
            return runs
        if not launched:
            time.sleep(0.5)
    return runs


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
    declaration = shortened(load_declaration(args.config), lake, timedelta(seconds=args.delay))
    rng, now = random.Random(7), datetime.now(UTC)
    sent = {
        "inventory": enqueue(declaration, "inventory", inventory_messages(args.inventory, rng)),
        "orders": enqueue(declaration, "orders",
                          order_messages(args.orders, now, rng)),
    }
    for queue, result in sent.items():
        print(f"enqueued {result.accepted} messages to {queue} ({len(result.refused)} refused)")
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        runs = drive(defs, instance, deadline=time.monotonic() + 240)
    print(f"\n{runs} Dagster runs launched by the sensors in {time.monotonic() - started:.0f}s\n")
    ok = True
    for queue, result in sent.items():
        tables = QueueTables.of(declaration, queue)
        print(f"{queue}:")
        for table in tables.all_tables:
            print(f"  {table:<14} {tables.open(table).count():>8}")
        line = conservation(tables)
        ok = ok and line.accounted == result.accepted
        print("  " + line.line(received=result.accepted))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
