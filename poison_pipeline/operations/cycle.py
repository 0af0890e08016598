"""A retry cycle as the operator console runs it: the engine's cycle, with the queue's operator
actions a kill left half done completed before it selects anything."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.engine.cycle import CycleReport, SessionSource
from poison_pipeline.engine.cycle import run_cycle as run_engine_cycle
from poison_pipeline.operations.interrupted import complete_interrupted
from poison_pipeline.operations.ramp import advance_ramps
from poison_pipeline.storage.lease import Holder

__all__ = ["run_cycle"]


def run_cycle(
    spark: SessionSource,
    declaration: Declaration,
    queue: str,
    table: str,
    now: datetime | None = None,
    run_id: str = "manual",
    on_wait: Callable[[Holder], None] | None = None,
    *,
    probe: bool = False,
) -> CycleReport:
    """Process the due messages of `table` in `queue` once; safe to re-run after any crash.

    Holds the queue's lease throughout: a second starter of any work on this queue waits, then
    fails naming this run (`on_wait` hears of a holder this run waits for). The queue's redrives,
    edits, purges and undos a kill left half done are completed first, and its ramps (`redrive --ramp`)
    go on once the cycle committed. `probe`: a probe of a queue
    an outage disabled, when its policy probes (`outage_recovery: probe`)."""
    return run_engine_cycle(spark, declaration, queue, table, now, run_id, on_wait,
                            complete_actions=complete_interrupted, after_commit=advance_ramps, probe=probe)
