"""Human output of the operator commands: rich tables rendered to text (plain, no colour codes, so
it reads the same in a terminal, a log and a test), times and breakdowns."""

from __future__ import annotations

import io
import shutil

from rich import box
from rich.console import Console
from rich.table import Table


def render(table: Table) -> str:
    width = max(shutil.get_terminal_size((160, 24)).columns, 100)
    written = io.StringIO()
    Console(file=written, width=width, color_system=None, force_terminal=False).print(table)
    return written.getvalue().rstrip("\n")


# A dry run records no action: it is named so, never by an id that `undo` or `actions` would not know.
DRY_RUN = "(dry run)"
DRY_RUN_NOTE = " (dry run: no table changed, no action recorded)"


def action_named(kind: str, action_id: str | None, *, dry_run: bool) -> str:
    """How a command's first line names the action it did or, in a dry run, would do."""
    return f"{kind} {DRY_RUN}" if dry_run else f"{kind} {action_id or ''}".rstrip()


def dry_run_note(dry_run: bool) -> str:
    return DRY_RUN_NOTE if dry_run else ""


def breakdown(by_group: dict[str, int], by_message_type: dict[str, int], sample_ids: list[str]) -> list[str]:
    """What an operator command takes, per failure group and per message type, with sample ids."""
    groups = Table("failure group", "messages", box=box.SIMPLE)
    for group, count in by_group.items():
        groups.add_row(group, str(count))
    types = Table("message type", "messages", box=box.SIMPLE)
    for kind, count in by_message_type.items():
        types.add_row(kind, str(count))
    return [render(groups), render(types), f"  e.g. {', '.join(sample_ids)}"]
