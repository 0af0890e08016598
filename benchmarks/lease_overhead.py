"""What a queue's lease costs each cycle: taking and releasing it, against the floor of any lease
kept as Delta commits (two bare overwrite commits of a one-row table: one to take, one to release).

Prints one JSON line: `lease_ms` and `floor_ms` (median and p90 of `--rounds` pairs each, on the
same disk, interleaved so a busy moment hits both), their ratio, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, os.path.dirname(__file__))
from cycle_throughput import emit  # noqa: E402

from poison_pipeline.domain.declaration import LeaseSettings  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.lease import TABLE_CONFIG  # noqa: E402
from poison_pipeline.storage.tables import QueueTables  # noqa: E402
from poison_pipeline.storage.writer import queue_writer  # noqa: E402


def _floor_pair(uri: str, row: pa.Table, free: pa.Table) -> None:
    write_deltalake(DeltaTable(uri), row, mode="overwrite")
    write_deltalake(DeltaTable(uri), free, mode="overwrite")


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"median": round(statistics.median(ordered) * 1000, 2),
            "p90": round(ordered[int(len(ordered) * 0.9)] * 1000, 2)}


def run(rounds: int, workdir: str) -> dict[str, Any]:
    tables = QueueTables(str(Path(workdir) / "lake"), "q", {}, ("inbound",), LeaseSettings())
    floor_uri = str(Path(workdir) / "floor")
    free = pa.Table.from_pylist([], schema=schemas.LEASE)
    row = pa.Table.from_pylist([{"holder_id": "h", "purpose": "bench", "run_id": "r", "host": "x", "pid": 1}],
                               schema=schemas.LEASE)
    write_deltalake(floor_uri, free, configuration=TABLE_CONFIG)  # the lease table's checkpoints too
    with queue_writer(tables, "warm-up"):  # creates the lease table: not part of a cycle's cost
        pass
    lease, floor = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        with queue_writer(tables, "bench"):
            pass
        lease.append(time.perf_counter() - started)
        started = time.perf_counter()
        _floor_pair(floor_uri, row, free)
        floor.append(time.perf_counter() - started)
    result: dict[str, Any] = {"benchmark": "lease_overhead", "rounds": rounds, "lease_ms": _summary(lease),
                              "floor_ms": _summary(floor), "load_average": [round(v, 2) for v in os.getloadavg()],
                              "cpus": os.cpu_count()}
    result["ratio_median"] = round(result["lease_ms"]["median"] / result["floor_ms"]["median"], 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 10:
        parser.error("--rounds must be at least 10")
    return emit(lambda workdir: run(args.rounds, workdir), args.workdir, "lease_overhead-")


if __name__ == "__main__":
    sys.exit(main())
