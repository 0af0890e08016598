"""Materialization metadata of the failure tables (poison, dead_letter, quarantine) and of the
ledgers: counts the UI plots over time, and the biggest failure groups as a Markdown table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dagster import AssetMaterialization, MetadataValue

from poison_pipeline.defs.naming import asset_key
from poison_pipeline.domain.alerts import FailureCount
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, QUARANTINE
from poison_pipeline.operations.groups import FailureGroup, failure_groups
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.text.groups import note_text

SHOWN_GROUPS = 10


def _cell(text: str) -> str:
    # <n>, <id>, <str> in normalised messages are text, not HTML tags.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace("\n", " ")


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _time(moment: datetime | None) -> str:
    return moment.isoformat() if moment else ""


def failure_group_metadata(groups: list[FailureGroup], shown: int = SHOWN_GROUPS) -> dict[str, Any]:
    """The failure groups of a table (the `groups` command's result): how many groups and failed
    messages, the largest, and the biggest `shown` as a Markdown table."""
    rows = []
    for group in groups[:shown]:
        error = f"{group.error_type}: {group.error_message}" if group.signature is not None \
            else f"no error: {', '.join(group.reasons)}"
        rows.append([group.as_of, group.signature or "", str(group.count), _time(group.first_failure_at),
                     _time(group.last_failure_at), error, group.top_frame or "",
                     "" if group.note is None else note_text(group.note)])
    table = _markdown(["group", "signature", "count", "first seen", "last seen", "error", "top frame", "note"], rows)
    if len(groups) > shown:
        table += f"\n\n{len(groups) - shown} smaller group(s) not shown: `poison-pipeline groups` lists them all."
    return {
        "failure_groups": MetadataValue.int(len(groups)),
        "failed_messages": MetadataValue.int(sum(g.count for g in groups)),
        "largest_failure_group": MetadataValue.int(groups[0].count if groups else 0),
        "failure_groups_top": MetadataValue.md(table if groups else "no failures"),
    }


def table_metadata(declaration: Declaration, queue: str, table: str) -> dict[str, Any]:
    """What a ledger table's materialization says: rows, oldest age, Delta version, and for a
    failure table its failure groups."""
    tables = QueueTables.of(declaration, queue)
    now = datetime.now(UTC)
    stats = tables.stats(table, now)
    age = (now - stats.oldest).total_seconds() if stats.oldest else 0.0
    metadata: dict[str, Any] = {
        "rows": MetadataValue.int(stats.rows),
        "oldest_age_s": MetadataValue.float(round(age, 3)),
        "delta_version": MetadataValue.int(stats.version),
    }
    if table in FAILURE_TABLES:
        metadata.update(failure_group_metadata(failure_groups(declaration, queue, table)))
    return metadata


def ledger_versions(declaration: Declaration, queue: str) -> dict[str, int]:
    """The Delta versions of dead_letter and quarantine, from their logs (0 before they exist)."""
    tables = QueueTables.of(declaration, queue)
    return {t: tables.open(t).version() if tables.exists(t) else 0 for t in (DEAD_LETTER, QUARANTINE)}


def changed_ledgers(declaration: Declaration, queue: str, before: dict[str, int]) -> list[AssetMaterialization]:
    """A materialization of each of dead_letter and quarantine whose version moved since `before`
    (`ledger_versions`): the run that wrote to them reports them, so each materialization the UI
    shows is a change of the table, with its failure groups."""
    return [AssetMaterialization(asset_key=asset_key(queue, table), metadata=table_metadata(declaration, queue, table))
            for table, version in ledger_versions(declaration, queue).items() if version != before[table]]


def failure_counts_markdown(failures: tuple[FailureCount, ...]) -> str:
    """What one cycle failed, per table and group, as a Markdown table."""
    return _markdown(["table", "group", "count", "error", "example"],
                     [[f.table, f.group, str(f.count), f.error, f.example_id or ""] for f in failures])
