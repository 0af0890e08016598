"""The actions ledger as a table."""

from __future__ import annotations

import json

from rich import box
from rich.table import Table

from poison_pipeline.domain.durations import when
from poison_pipeline.operations.actions import Action
from poison_pipeline.text.render import render


def format_actions(actions: list[Action]) -> str:
    if not actions:
        return "no operator action recorded"
    table = Table("action", "queue", "kind", "actor", "at", "state", "counts", "arguments", box=box.SIMPLE)
    for a in actions:
        table.add_row(a.action_id, a.queue, a.kind, a.actor, when(a.at), a.state,
                      " ".join(f"{k}={v}" for k, v in a.counts.items()), json.dumps(a.arguments, sort_keys=True))
    return render(table)
