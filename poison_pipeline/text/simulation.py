"""A policy simulation as a table (the command line) and as Markdown (Dagster's asset metadata)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from poison_pipeline.domain.simulation import Fates
from poison_pipeline.operations.simulate import Simulation, SimulationRow
from poison_pipeline.text.render import render

__all__ = ["format_simulation", "simulation_markdown"]

_HEADERS = ("message type", "failure group", "messages", "simulated", "recorded", "attempts", "time (median / max)",
            "assumed")


def _fates(counts: dict[str, int]) -> str:
    """Counts in the order of the flow (`Fates`), then what only the record has."""
    order = [f.value for f in Fates]
    keys = sorted(counts, key=lambda k: (order.index(k) if k in order else len(order), k))
    return ", ".join(f"{k} {counts[k]}" for k in keys) or "-"


def _cells(row: SimulationRow) -> tuple[str, ...]:
    return (row.message_type, row.group, str(row.messages), _fates(row.simulated), _fates(row.recorded),
            f"{row.attempts_mean:g}", f"{row.seconds_median:g}s / {row.seconds_max:g}s", str(row.assumed))


def _summary(found: Simulation) -> list[str]:
    window = "all recorded attempts" if found.since is None else f"attempts since {found.since.isoformat()}"
    return [
        f"queue {found.queue}: {found.messages} messages, {found.attempts} attempts ({window})",
        f"  simulated: {_fates(found.simulated)}",
        f"  recorded:  {_fates(found.recorded)}",
        f"  {found.changed} message(s) would end elsewhere under the candidate policy",
    ]


def format_simulation(found: Simulation) -> str:
    table = Table(*_HEADERS, box=box.SIMPLE)
    for row in found.rows:
        table.add_row(*_cells(row))
    lines = _summary(found)
    if found.rows:
        lines.append(render(table))
    lines.append("assumed:")
    lines.extend(f"  - {text}" for text in found.assumptions)
    return "\n".join(lines)


def simulation_markdown(found: Simulation) -> str:
    lines = [line.strip() + "  " for line in _summary(found)]
    lines += ["", "| " + " | ".join(_HEADERS) + " |", "|" + " --- |" * len(_HEADERS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in _cells(row)) + " |" for row in found.rows]
    lines += ["", "Assumed:", *(f"- {text}" for text in found.assumptions)]
    return "\n".join(lines)
