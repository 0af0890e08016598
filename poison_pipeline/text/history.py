"""A message's journey as a table."""

from __future__ import annotations

from rich import box
from rich.table import Table

from poison_pipeline.domain.durations import when
from poison_pipeline.operations.history import Journey
from poison_pipeline.text.render import render


def format_history(journey: Journey) -> str:
    table = Table("at", "what", "queue/table", "cycle", "attempt", "detail", "run / action", box=box.SIMPLE)
    for e in journey.events:
        detail = e.detail
        if e.error_type or e.error_message:
            detail += f": {e.error_type}: {e.error_message}"
        if e.actor:
            detail += f" (by {e.actor})"
        ref = e.action_id or e.run_id or ""
        table.add_row(when(e.at), e.kind + (" (inferred)" if e.inferred else ""), f"{e.queue}/{e.table or '-'}",
                      "" if e.cycle is None else str(e.cycle), "" if e.attempt is None else str(e.attempt),
                      detail, ref)
    return f"message {journey.message_id}: {len(journey.events)} events\n" + render(table)
