"""What an archive or a restore did or would do, in words."""

from __future__ import annotations

from poison_pipeline.operations.archive import ArchiveResult
from poison_pipeline.text.render import breakdown


def format_archive(result: ArchiveResult) -> str:
    if result.already_done:
        return f"{result.kind} {result.action_id} already completed: nothing changed now"
    verb = f"would {result.kind}" if result.dry_run else f"{result.kind}d"
    name = result.action_id or ("(dry run)" if result.dry_run else "")
    lines = [f"{result.kind} {name}: {result.queue}/{result.table}: {verb} {result.count} message(s)"
             + (" (dry run: no table changed)" if result.dry_run else "")]
    if result.count:
        lines += breakdown(result.by_group, result.by_message_type, result.sample_ids)
    return "\n".join(lines)
