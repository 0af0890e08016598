"""The soak's starters outside Dagster, each a process of its own (so a Spark session it needs ends
with it):

    soak_worker.py cycle CONFIG QUEUE TABLE   # one cycle, as a script beside Dagster would start it
    soak_worker.py drain CONFIG SECONDS       # cycles and offers until nothing waits anywhere

`cycle` prints one JSON line: `outcome` (`ran`, or `busy` when the lease stayed held past
`lease.wait`, exit code 3), `waited` (it found the lease held and waited), the cycle's counts.
`drain` prints what it ran, and exits 1 if something still waits when time is up.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from poison_pipeline.broker.transmission import pending_count, transmit
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.engine.session import build_session
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.control import queue_state
from poison_pipeline.storage.lease import Holder, LeaseHeld
from poison_pipeline.storage.tables import TRANSMISSION, QueueTables

BUSY = 3


def _session(declaration: Declaration) -> Any:
    return functools.cache(lambda: build_session(declaration.spark))


def one_cycle(config: str, queue: str, table: str) -> int:
    declaration = load_declaration(config)
    held_by: list[Holder] = []
    try:
        report = run_cycle(_session(declaration), declaration, queue, table, run_id="soak-outside",
                           on_wait=held_by.append)
    except LeaseHeld as busy:
        print(json.dumps({"outcome": "busy", "waited": True, "error": str(busy)}))
        return BUSY
    print(json.dumps({"outcome": "ran", "waited": bool(held_by), "skipped": report.skipped,
                      "messages": report.counts.get("messages", 0), "duration_s": report.duration_s}))
    return 0


def waiting(declaration: Declaration, now: datetime) -> dict[str, int]:
    """Rows waiting per queue/table (transmission included), disabled queues marked."""
    found = {}
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        here = {f"{queue}/{table}": tables.stats(table, now).rows
                for table in tables.waiting if tables.exists(table)}
        if tables.exists(TRANSMISSION):
            here[f"{queue}/{TRANSMISSION}"] = pending_count(tables)
        here = {where: rows for where, rows in here.items() if rows}
        if here and not queue_state(tables).enabled:
            here[f"{queue} (disabled)"] = 1
        found.update(here)
    return found


def drain(config: str, seconds: float) -> int:
    """Run every due cycle and offer every pending send, over and over, until nothing waits."""
    declaration = load_declaration(config)
    session = _session(declaration)
    deadline = time.monotonic() + seconds
    cycles: dict[str, int] = {}
    while True:
        now = datetime.now(UTC)
        left = waiting(declaration, now)
        if not left or time.monotonic() > deadline:
            break
        ran = False
        for queue in declaration.queues:
            tables = QueueTables.of(declaration, queue)
            for table in tables.waiting:
                if tables.exists(table) and tables.stats(table, now).due_rows:
                    report = run_cycle(session, declaration, queue, table, run_id="soak-drain")
                    ran = ran or not report.skipped
                    cycles[f"{queue}/{table}"] = cycles.get(f"{queue}/{table}", 0) + 1
            if tables.exists(TRANSMISSION) and pending_count(tables):
                transmit(declaration, queue, run_id="soak-drain")
        if not ran:
            time.sleep(1.0)  # retry delays: wait for the next due time
    print(json.dumps({"cycles": cycles, "left": left}))
    return 1 if left else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    cycle = modes.add_parser("cycle")
    cycle.add_argument("config")
    cycle.add_argument("queue")
    cycle.add_argument("table")
    draining = modes.add_parser("drain")
    draining.add_argument("config")
    draining.add_argument("seconds", type=float)
    args = parser.parse_args(argv)
    if args.mode == "cycle":
        return one_cycle(args.config, args.queue, args.table)
    return drain(args.config, args.seconds)


if __name__ == "__main__":
    sys.exit(main())
