"""Human output of the operator commands: rich tables rendered to text (plain, no colour codes, so
it reads the same in a terminal, a log and a test)."""

from __future__ import annotations

import io
import shutil
from datetime import datetime

from rich.console import Console
from rich.table import Table


def render(table: Table) -> str:
    width = max(shutil.get_terminal_size((160, 24)).columns, 100)
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(table)
    return console.file.getvalue().rstrip("\n")  # type: ignore[attr-defined]


def when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%SZ")
