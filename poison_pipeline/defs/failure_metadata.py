"""Materialization metadata of the failure tables (poison, dead_letter, quarantine) and of the
ledgers: counts the UI plots over time, and the biggest failure groups as a Markdown table; the
queue's health figures each cycle records; the materializations of failure tables an operator changed."""

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
from poison_pipeline.views.health import health

SHOWN_GROUPS = 10
EXAMPLES = 3


def _cell(text: str) -> str:
    # <n>, <id>, <str> in normalised messages are text, not HTML tags.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|").replace("\n", " ")


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _time(moment: datetime | None) -> str:
    """To the second, in UTC: a narrow column."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if moment else ""


def _error(group: FailureGroup) -> str:
    if group.signature is None:
        return f"no error: {', '.join(group.reasons)}"
    at = f" (at {group.top_frame})" if group.top_frame else ""
    # The class name alone: the module path is in `groups --json`, and the column stays readable.
    kind = (group.error_type or "").rsplit(".", 1)[-1]
    return f"{kind}: {group.error_message}{at}"


def failure_group_metadata(groups: list[FailureGroup], shown: int = SHOWN_GROUPS) -> dict[str, Any]:
    """The failure groups of a table (the `groups` command's result): how many groups and failed
    messages, the largest, and the biggest `shown` as a Markdown table, as `groups` prints them:
    error and its top frame, message types and the latest example ids (the signature is the id's
    first 8 hex digits: `groups --json` gives it whole)."""
    rows = []
    for group in groups[:shown]:
        types = ", ".join(f"{kind} {n}" for kind, n in sorted(group.message_types.items(), key=lambda t: -t[1]))
        # What an operator reads first leads: the error and examples, before the times.
        rows.append([group.as_of, str(group.count), _error(group), ", ".join(group.example_ids[:EXAMPLES]), types,
                     _time(group.first_failure_at), _time(group.last_failure_at),
                     "" if group.note is None else note_text(group.note)])
    table = _markdown(["group", "count", "error", "e.g.", "message types", "first failure", "last failure", "note"],
                      rows)
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


def health_metadata(declaration: Declaration, queue: str) -> dict[str, Any]:
    """The queue's health as numbers the UI plots: each place's depth (`depth_<table>`) and the
    messages in its failure tables that failed in the last hour."""
    found = health(QueueTables.of(declaration, queue))
    return {**{f"depth_{table}": MetadataValue.int(n) for table, n in found.depths.items()},
            "failed_last_hour": MetadataValue.int(found.failed_recently)}


def ledger_versions(declaration: Declaration, queue: str,
                    tables_of: tuple[str, ...] = (DEAD_LETTER, QUARANTINE)) -> dict[str, int]:
    """The Delta versions of dead_letter and quarantine (or `tables_of`), from their logs (0 before
    they exist)."""
    tables = QueueTables.of(declaration, queue)
    return {t: tables.open(t).version() if tables.exists(t) else 0 for t in tables_of}


def failure_versions(declaration: Declaration, queue: str) -> dict[str, int]:
    """The versions of every failure table: what `materialize_changed` compares with."""
    return ledger_versions(declaration, queue, FAILURE_TABLES)


def _changed(declaration: Declaration, queue: str, before: dict[str, int], *,
             with_health: bool) -> list[AssetMaterialization]:
    changed = [t for t, version in ledger_versions(declaration, queue, tuple(before)).items() if version != before[t]]
    figures = health_metadata(declaration, queue) if changed and with_health else {}
    return [AssetMaterialization(asset_key=asset_key(queue, table),
                                 metadata={**table_metadata(declaration, queue, table), **figures})
            for table in changed]


def materialize_changed(declaration: Declaration, queue: str, before: dict[str, int]) -> list[AssetMaterialization]:
    """A materialization of each failure table an operator's run changed since `before`
    (`failure_versions`), with what its page shows (rows, failure groups) and the queue's health:
    as a cycle's, each materialization of a failure table is a change of it, and its page is
    current without waiting for a cycle."""
    return _changed(declaration, queue, before, with_health=True)


def changed_ledgers(declaration: Declaration, queue: str, before: dict[str, int]) -> list[AssetMaterialization]:
    """A materialization of each of dead_letter and quarantine whose version moved since `before`
    (`ledger_versions`): the run that wrote to them reports them, so each materialization the UI
    shows is a change of the table, with its failure groups."""
    return _changed(declaration, queue, before, with_health=False)


def failure_counts_markdown(failures: tuple[FailureCount, ...]) -> str:
    """What one cycle failed, per table and group, as a Markdown table."""
    return _markdown(["table", "group", "count", "error", "example"],
                     [[f.table, f.group, str(f.count), f.error, f.example_id or ""] for f in failures])
