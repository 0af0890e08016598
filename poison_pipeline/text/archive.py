"""What an archive or a restore did or would do, in words."""

from __future__ import annotations

from poison_pipeline.operations.archive import ArchiveResult
from poison_pipeline.text.render import action_named, breakdown, dry_run_note


def format_archive(result: ArchiveResult) -> str:
    if result.already_done:
        return f"{result.kind} {result.action_id} already completed: nothing changed now"
    verb = f"would {result.kind}" if result.dry_run else f"{result.kind}d"
    lines = [f"{action_named(result.kind, result.action_id, dry_run=result.dry_run)}: {result.queue}/{result.table}: "
             f"{verb} {result.count} message(s){dry_run_note(result.dry_run)}"]
    if result.count:
        lines += breakdown(result.by_group, result.by_message_type, result.sample_ids)
    return "\n".join(lines)
