"""Failure groups as a table."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from poison_pipeline.domain.durations import when
from poison_pipeline.operations.groups import FailureGroup, GroupNote


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{value} ({count})" for value, count in counts.items())


def _error_cell(group: FailureGroup) -> Text:
    cell = Text()
    if group.signature is None:
        cell.append(f"no error: {', '.join(group.reasons) or 'no reason recorded'}", style="bold")
    else:
        cell.append(f"{group.error_type or '?'}: {group.error_message or ''}", style="bold")
        cell.append(f"\nat {group.top_frame or '? (not recoverable from the stored stack)'}")
    if group.reasons and group.signature is not None:
        cell.append(f"\nreasons: {_counted(group.reasons)}")
    cell.append(f"\ntypes: {_counted(group.message_types)}")
    cell.append(f"\ne.g. {', '.join(group.example_ids)}", style="dim")
    if group.note is not None:
        cell.append(f"\nnote: {note_text(group.note)}", style="italic")
    return cell


def note_text(note: GroupNote) -> str:
    """A group's note as one line: the text, its owner, who wrote it and when."""
    owner = f" (owner: {note.owner})" if note.owner else ""
    return f"{note.text}{owner} - {note.actor}, {when(note.at)}"


def groups_table(groups: Sequence[FailureGroup]) -> Table:
    """The groups as a rich table, biggest first; `--json` gives the same data for programs."""
    total = sum(g.count for g in groups)
    # The versions read: a group given as id@version acts on what was in the table then, no more.
    read = sorted({(g.queue, g.table, g.version) for g in groups if g.version is not None})
    versions = ", ".join(f"{queue}/{name} v{version}" for queue, name, version in read)
    table = Table(title=f"{len(groups)} failure group(s), {total} failed message(s); read {versions}",
                  title_justify="left",
                  box=box.SIMPLE_HEAD, show_lines=True)
    table.add_column("group", no_wrap=True)
    table.add_column("queue\ntable", overflow="fold")
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("first failure\nlast failure")
    table.add_column("error, top frame\nmessage types, examples", overflow="fold")
    for group in groups:
        table.add_row(group.as_of, f"{group.queue}\n{group.table}", str(group.count),
                      f"{when(group.first_failure_at)}\n{when(group.last_failure_at)}", _error_cell(group))
    return table
