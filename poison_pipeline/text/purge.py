"""What a purge did or would do, in words."""

from __future__ import annotations

from poison_pipeline.domain.durations import when
from poison_pipeline.operations.purge import PurgeResult
from poison_pipeline.text.render import action_named, breakdown, dry_run_note


def _age_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def format_purge(result: PurgeResult) -> str:
    if result.already_done:
        return f"purge {result.purge_id} already completed: nothing deleted now"
    verb = "would delete" if result.dry_run else "deleted"
    lines = [f"{action_named('purge', result.purge_id, dry_run=result.dry_run)}: {result.queue}/{result.table}, "
             f"failed more than {_age_text(result.older_than_seconds)} ago (before {when(result.cutoff)}): "
             f"{verb} {result.purged} message(s) for good{dry_run_note(result.dry_run)}"]
    if result.skipped_moved_since:
        lines.append(f"  skipped {result.skipped_moved_since}: no longer where this interrupted purge's plan found "
                     "them (redriven, or taken by a cycle, since): kept")
    if result.skipped_held:
        lines.append(f"  skipped {result.skipped_held}: planned by interrupted redrive(s) {', '.join(result.held_by)}, "
                     "which may have sent them back already: run it again with its --id (or let the queue's next "
                     "cycle complete it), then purge again")
    if result.resumed:
        lines.append(f"  completed interrupted purge(s) first: {', '.join(result.resumed)}")
    if result.purged:
        lines.append(f"  failed from {when(result.oldest_failure)} to {when(result.newest_failure)}")
        lines += breakdown(result.by_group, result.by_message_type, result.sample_ids)
    return "\n".join(lines)
