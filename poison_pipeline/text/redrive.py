"""What a redrive did or would do, in words."""

from __future__ import annotations

import json

from poison_pipeline.domain.durations import when
from poison_pipeline.operations.ramp import RampResult
from poison_pipeline.operations.redrive import RedriveResult
from poison_pipeline.text.render import action_named, breakdown, dry_run_note


def format_redrive(result: RedriveResult) -> str:
    verb = "would move" if result.dry_run else "moved"
    head = (f"{action_named('redrive', result.redrive_id, dry_run=result.dry_run)}: {result.queue}/{result.source} "
            f"-> {result.target}/inbound: {verb} {result.moved} of {result.selected} selected")
    if result.already_done and result.abandoned:
        return (f"redrive {result.redrive_id} was abandoned: killed before it planned anything, it moved nothing "
                "and a cycle closed it; nothing moved now (give another --id to redrive again)")
    if result.already_done:
        return (f"redrive {result.redrive_id} already completed: nothing moved now "
                "(give another --id to redrive again)")
    lines = [head + dry_run_note(result.dry_run)]
    if result.as_recorded:
        recorded = ", ".join(f"{k} {json.dumps(v)}" for k, v in sorted(result.as_recorded.items()))
        lines.append(f"  completed as it was recorded when it was interrupted ({recorded}), not as this "
                     "command asked")
    for count, why in ((result.skipped_processed, "already processed by the target (its ledger): left in place"),
                       (result.skipped_loop_guard, "redriven max_redrives times already: left in place "
                                                   "(--force to send them anyway)"),
                       (result.skipped_limit, "beyond --limit: left in place"),
                       (result.skipped_moved_since, "no longer where this interrupted redrive's plan found them "
                                                    "(purged, or taken by a cycle, since): not sent")):
        if count:
            lines.append(f"  skipped {count}: {why}")
    if result.ramp_steps:
        lines.append(f"  a ramp would send them in {len(result.ramp_steps)} step(s) of "
                     f"{', '.join(map(str, result.ramp_steps))}, each once a cycle took the one before")
    if result.moved and result.first_due != result.last_due:
        lines.append(f"  released from {when(result.first_due)} to {when(result.last_due)} (--rate)")
    if result.moved:
        lines += breakdown(result.by_group, result.by_message_type, result.sample_ids)
    return "\n".join(lines)


def format_ramp(ramp: RampResult) -> str:
    """A ramp's progress: the step sent, what waits, and how it ended."""
    steps = ",".join("all" if size is None else str(size) for size in ramp.steps)
    head = f"ramp {ramp.ramp_id}: {ramp.queue}/{ramp.source}, steps {steps}"
    if ramp.ramp_id is None:
        return f"ramp: {ramp.queue}/{ramp.source}: nothing selected, nothing sent"
    if ramp.state == "stopped":
        return (f"{head}: stopped at step {ramp.step}: {len(ramp.failed_again) or ramp.parked} message(s) failed "
                f"again (more than {ramp.max_failures}); {ramp.parked} parked back in {ramp.source}"
                + (f": {', '.join(ramp.failed_again[:5])}" if ramp.failed_again else ""))
    if ramp.state == "completed":
        return f"{head}: completed: {ramp.sent} of {ramp.selected} message(s) sent in {ramp.step} step(s)"
    return (f"{head}: step {ramp.step} sent ({ramp.sent} of {ramp.selected} so far), {ramp.waiting} waiting for "
            "a cycle; the queue's cycles go on with it (`actions` shows it, `redrive --id` runs it again)")
