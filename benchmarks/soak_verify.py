"""What the soak checks once the queues are quiet: the asset checks' conservation and one-place, the
application's deliveries against the processed ledgers and the runs that failed, and whether cycle
time grew."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import PROCESSED
from poison_pipeline.operations.checks import check_conservation, check_one_place
from poison_pipeline.storage.intake import accepted_total
from poison_pipeline.storage.tables import QueueTables

# Cycle time may grow by this factor from the first third to the last (median seconds per message).
GROWTH_TARGET = 1.5


def balances(declaration: Declaration, enqueued: dict[str, int]) -> dict[str, Any]:
    """Per queue: the conservation and one_place checks as Dagster runs them, and whether the intake
    ledger accepted what the producer enqueued (queues fed only by senders have no figure of ours)."""
    found: dict[str, Any] = {}
    for queue in declaration.queues:
        tables = QueueTables.of(declaration, queue)
        conservation, one_place = check_conservation(tables), check_one_place(tables)
        accepted = accepted_total(tables) or 0
        found[queue] = {"conservation": conservation.passed, "one_place": one_place.passed,
                        "line": conservation.metadata["line"], "accepted": accepted,
                        "intake_matches": queue not in enqueued or accepted == enqueued[queue],
                        "failed": [c.description for c in (conservation, one_place) if not c.passed]}
    return found


@dataclass(frozen=True)
class RunSpan:
    """A Dagster run's worker process and when it ran, to find the run a delivery was made in."""

    run_id: str
    pid: int
    start: float
    end: float
    # Succeeded, or committed its cycle before it failed (its cycle's materialization is logged):
    # a delivery made in any other run was never committed, and its cycle's recovery delivers again.
    committed: bool


def _run_of(delivery: dict[str, Any], spans: dict[int, list[RunSpan]]) -> RunSpan | None:
    for pid in (delivery["pid"], *delivery.get("ancestors", [])):
        for span in spans.get(pid, []):
            if span.start - 5 <= delivery["at"] <= span.end + 5:
                return span
    return None


def deliveries(declaration: Declaration, records: list[dict[str, Any]], runs: list[RunSpan]) -> dict[str, Any]:
    """Each message delivered at most once, except that a run that did not succeed (killed, or failed)
    committed nothing and its cycle's messages are delivered again (the README: receivers are
    idempotent by id); every processed message delivered, every delivered one processed."""
    spans: dict[int, list[RunSpan]] = defaultdict(list)
    for run in runs:
        spans[run.pid].append(run)
    committed: Counter[str] = Counter()
    uncommitted: Counter[str] = Counter()
    seen: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        span = _run_of(record, spans)
        (uncommitted if span is not None and not span.committed else committed)[record["id"]] += 1
        # Each delivery as the verdict saw it: a duplicate is explained (or not) by these.
        seen[record["id"]].append({"at": record["at"], "pid": record["pid"],
                                   "run": span.run_id if span else None,
                                   "run_committed": span.committed if span else None})
    processed: set[str] = set()
    for queue in declaration.queues:
        ledger = QueueTables.of(declaration, queue).open(PROCESSED).to_pyarrow_table(
            columns=["message_id", "disposition"])
        processed |= set(ledger.filter(pc.equal(ledger["disposition"], "processed"))["message_id"].to_pylist())
    twice = sorted(mid for mid, n in committed.items() if n > 1)
    delivered = set(committed)
    return {
        "deliveries": len(records),
        "duplicates_outside_allowance": len(twice),
        "duplicate_examples": twice[:10],
        "duplicate_deliveries": {mid: seen[mid] for mid in twice[:3]},
        "redelivered_after_failed_runs": sum(1 for mid in uncommitted if mid in committed),
        "deliveries_in_failed_runs": sum(uncommitted.values()),
        "delivered_not_processed": sorted(delivered - processed)[:10],
        "processed_not_delivered": sorted(processed - delivered - set(uncommitted))[:10],
        "processed_without_committed_delivery": len(processed - delivered),
        "processed": len(processed),
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 5) if values else None


def growth(cycles: list[dict[str, Any]], start: float, stop: float) -> dict[str, Any]:
    """Seconds per message of the cycles (with messages) in the first and last third of the producing
    window. Per queue: the medians of each third. The growth: each cycle's seconds per message
    divided by the median of its queue and table's cycles (an inbound cycle of 100 and a retry cycle
    of 3 are not comparable), then the median of the last third's over the first third's, all
    queues together: a few cycles per queue and third is all a short soak has."""
    third = (stop - start) / 3
    timed = [c for c in cycles if c["messages"] > 0 and start <= c["at"] <= stop]
    for cycle in timed:
        cycle["s_per_message"] = cycle["duration_s"] / cycle["messages"]
    medians = {key: statistics.median(c["s_per_message"] for c in timed if (c["queue"], c["table"]) == key)
               for key in {(c["queue"], c["table"]) for c in timed}}
    first = [c for c in timed if c["at"] < start + third]
    last = [c for c in timed if c["at"] >= stop - third]
    per_queue: dict[str, dict[str, Any]] = {}
    for queue in sorted({c["queue"] for c in timed}):
        parts = [[c for c in part if c["queue"] == queue] for part in (first, last)]
        per_queue[queue] = {
            "cycles": [len(part) for part in parts],
            "s_per_message": [_median([c["s_per_message"] for c in part]) for part in parts],
            "duration_s": [_median([c["duration_s"] for c in part]) for part in parts],
        }
    relative = [[c["s_per_message"] / medians[(c["queue"], c["table"])] for c in part] for part in (first, last)]
    # A ratio needs a few cycles on each side: one cycle's duration is noise on a shared machine.
    measured = all(len(part) >= 3 for part in relative)
    ratio = statistics.median(relative[1]) / statistics.median(relative[0]) if measured else None
    return {"per_queue": per_queue, "cycles": [len(first), len(last)],
            "growth": round(ratio, 3) if ratio is not None else None, "growth_target": GROWTH_TARGET}
