"""What the failure-group metadata costs a materialization of a big failure table, and what the
messages_failed sensor costs an evaluation.

A queue's quarantine table holds `--messages` failed messages (written in `--commits` appends, as
many cycles would) in `--groups` failure groups of skewed sizes, each row with a real-sized stack.
Timed, interleaved over `--rounds` rounds:
- `metadata_ms`: `table_metadata(...)`, everything a quarantine materialization computes (row
  count and oldest age from the log, the failure groups, the Markdown table);
- `floor_ms`: the fastest honest way to get the same groups: one pyarrow scan of the three narrow
  columns the counts need (signature, reason, quarantined_at) and one group-by for count, first and
  last failure, with no example rows, no error text and no table.
Then the sensor: an events table with `--events` messages_failed commits, one evaluation that finds
the newest event (cursor one version behind) and one that finds nothing new (cursor current).

Prints one JSON line with medians and p90s, their ratio, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(__file__))
from cycle_throughput import emit  # noqa: E402

from poison_pipeline.defs.alerts import decide_alerts  # noqa: E402
from poison_pipeline.defs.failure_metadata import table_metadata  # noqa: E402
from poison_pipeline.domain.alerts import MESSAGES_FAILED, FailureCount, failures_to_json  # noqa: E402
from poison_pipeline.domain.declaration import parse_declaration  # noqa: E402
from poison_pipeline.domain.errors import normalise, signature_of  # noqa: E402
from poison_pipeline.storage import schemas  # noqa: E402
from poison_pipeline.storage.control import event_row  # noqa: E402
from poison_pipeline.storage.tables import EVENTS, QUARANTINE, QueueTables  # noqa: E402
from poison_pipeline.storage.writer import queue_writer  # noqa: E402

_FRAME = '  File "/srv/app/handlers.py", line {n}, in handle_{g}\n    value = parse(message.body)\n'


def _rows(start: int, count: int, groups: int, now: datetime) -> pa.Table:
    ids = range(start, start + count)
    # Skewed like real failures: group k holds about twice as many messages as group k + 1.
    group_of = [_skewed(i, groups) for i in ids]
    kinds = [f"myapp.errors.Bug{g}" for g in group_of]
    messages = [f"cannot read quantity {i} of part P-{i % 977}" for i in ids]
    stacks = ["Traceback (most recent call last):\n" + "".join(_FRAME.format(n=k, g=g) for k in range(12))
              + f"{kind}: {message}" for g, kind, message in zip(group_of, kinds, messages, strict=True)]
    # As the engine signs them, so `groups` recovers each group's top frame from its stacks.
    signature = {g: signature_of(f"myapp.errors.Bug{g}", normalise(messages[0]), f"handlers.py:handle_{g}")
                 for g in range(groups)}
    n = len(ids)
    columns = {
        "message_id": [f"m-{i}" for i in ids], "conversation_id": [None] * n, "sequence_number": [None] * n,
        "message_type": ["withdrawal"] * n, "body": [b'{"part": "P-1", "quantity": "3 boxes"}'] * n,
        "encoding": ["json"] * n, "enqueued_at": [now] * n, "expires_at": [None] * n, "sender": ["shop"] * n,
        "headers": [[]] * n, "abort_count": [1] * n, "total_abort_count": [6] * n, "move_count": [5] * n,
        "redrive_count": [0] * n, "due_at": [now] * n, "entered_at": [now] * n, "batch_id": [f"b-{start}"] * n,
        "last_error_type": kinds, "last_error_message": messages, "last_error_stack": stacks,
        "last_error_signature": [signature[g] for g in group_of], "reason": ["poison"] * n,
        "from_table": ["poison"] * n, "quarantined_at": [now - timedelta(seconds=i) for i in ids],
    }
    return pa.table({f.name: pa.array(columns[f.name], f.type) for f in schemas.QUARANTINE}, schema=schemas.QUARANTINE)


def _skewed(i: int, groups: int) -> int:
    """Group of message i: half in group 0, a quarter in group 1, and so on."""
    bits = (i * 2654435761) % (1 << 32)
    return min((bits ^ (bits - 1)).bit_length() - 1, groups - 1)


def _floor(tables: QueueTables) -> int:
    narrow = tables.open(QUARANTINE).to_pyarrow_dataset().to_table(
        columns=["last_error_signature", "reason", "quarantined_at"])
    counted = narrow.group_by(["last_error_signature", "reason"]).aggregate(
        [([], "count_all"), ("quarantined_at", "min"), ("quarantined_at", "max")])
    return int(pc.sum(counted["count_all"]).as_py())


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"median": round(statistics.median(ordered) * 1000, 2),
            "p90": round(ordered[int(len(ordered) * 0.9)] * 1000, 2)}


def _timed(function: Any) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def run(messages: int, commits: int, groups: int, rounds: int, events: int, workdir: str) -> dict[str, Any]:
    declaration = parse_declaration({"lake_root": str(Path(workdir) / "lake"), "queues": {
        "q": {"handler": "poison_pipeline.examples.handlers:withdraw_inventory"}}})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    now = datetime.now(UTC)
    per_commit = messages // commits
    failures = (FailureCount("poison", "0123abcd", 3, "myapp.errors.Bug0", "m-1"),)
    with queue_writer(tables, "benchmark") as writer:
        for c in range(commits):
            writer.append(QUARANTINE, _rows(c * per_commit, per_commit, groups, now))
        for k in range(events):
            writer.append(EVENTS, pa.Table.from_pylist([event_row(
                MESSAGES_FAILED, now, "poison_pipeline", "inbound cycle poisoned 3", "m-1", "inbound",
                run_id=f"run-{k}", cycle_seq=k + 1, failures=failures_to_json(failures))], schema=schemas.EVENTS))
    version = tables.open(EVENTS).version()
    metadata = table_metadata(declaration, "q", QUARANTINE)  # warm-up, and what is checked below
    assert metadata["failed_messages"].value == per_commit * commits == _floor(tables)
    timed_metadata, floor, found, idle = [], [], [], []
    for _ in range(rounds):
        timed_metadata.append(_timed(lambda: table_metadata(declaration, "q", QUARANTINE)))
        floor.append(_timed(lambda: _floor(tables)))
        started = time.perf_counter()
        decision = decide_alerts(tables, {"version": version - 1}, MESSAGES_FAILED)
        found.append(time.perf_counter() - started)
        assert len(decision.events) == 1
        idle.append(_timed(lambda: decide_alerts(tables, {"version": version}, MESSAGES_FAILED)))
    result = {
        "benchmark": "failure_metadata", "messages": per_commit * commits, "commits": commits,
        "groups": metadata["failure_groups"].value, "rounds": rounds,
        "metadata_ms": _summary(timed_metadata), "floor_ms": _summary(floor),
        "events_commits": events, "sensor_new_event_ms": _summary(found), "sensor_nothing_new_ms": _summary(idle),
        "load_average": [round(v, 2) for v in os.getloadavg()], "cpus": os.cpu_count(),
    }
    result["ratio_median"] = round(result["metadata_ms"]["median"] / result["floor_ms"]["median"], 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    if min(args.messages, args.commits, args.groups, args.events) < 1 or args.rounds < 5:
        parser.error("--messages, --commits, --groups and --events must be positive, --rounds at least 5")
    return emit(lambda workdir: run(args.messages, args.commits, args.groups, args.rounds, args.events, workdir),
                args.workdir, "failure_metadata-")


if __name__ == "__main__":
    sys.exit(main())
