"""A message's places, envelope, errors and edits, in words."""

from __future__ import annotations

from datetime import datetime, timedelta

from poison_pipeline.domain.durations import spoken, when
from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED, QUARANTINE
from poison_pipeline.operations.inspect_message import ErrorView, Inspection, Location, printable, render_body


def _error_text(error: ErrorView | None, stacks: bool, indent: str) -> list[str]:
    if error is None:
        return []
    lines = [f"{indent}{error.type}: {error.message}  [signature {error.signature}]"]
    if stacks and error.stack:
        lines.extend(f"{indent}  {line}" for line in error.stack.rstrip().splitlines())
    return lines


def format_inspection(found: Inspection, now: datetime, stacks: bool = False) -> str:
    env = found.envelope
    lines = [f"message {found.message_id}" + (f" as of {found.as_of}" if found.as_of else "")]
    if len(found.locations) > 1:
        lines.append(f"  ! found in {len(found.locations)} places (expected one)")
    for place in found.locations:
        lines.append(f"  in {place.queue}/{place.table}" + _place_detail(place, now))
        if place.archived_at is not None:
            lines.append(f"    archived at {when(place.archived_at)} ({place.archived_by}): left out of groups, "
                         "checks and alerts until restored")
        counts = [f"{name} {value}" for name, value in (
            ("abort_count", place.abort_count), ("total_abort_count", place.total_abort_count),
            ("move_count", place.move_count)) if value is not None]
        if counts:
            lines.append("    " + ", ".join(counts))
        if place.last_error is not None:
            lines.append("    last error:")
            lines.extend(_error_text(place.last_error, stacks, "      "))
    if not found.locations:
        lines.append("  in no table (only its attempts are recorded)")
    lines.extend(f"  {name} {value}" for name, value in (
        ("message_type", env.message_type), ("encoding", env.encoding),
        ("conversation_id", env.conversation_id), ("sequence_number", env.sequence_number),
        ("sender", env.sender), ("enqueued_at", env.enqueued_at and when(env.enqueued_at)),
        ("expires_at", env.expires_at and when(env.expires_at))) if value is not None)
    if env.headers:
        lines.append("  headers " + ", ".join(f"{k}={printable(v)}" for k, v in env.headers.items()))
    size = "" if env.body.size is None else f" ({env.body.size} bytes, shown as {env.body.shown_as})"
    lines.append(f"  body{size}:")
    if env.body.note:
        lines.append(f"    note: {env.body.note}")
    lines.extend(f"    {line}" for line in env.body.text.splitlines() or [""])
    lines.append(f"  attempts ({len(found.attempts)}):")
    for a in found.attempts:
        lines.append(
            f"    {when(a.started_at)}  {a.queue}/{a.table} cycle {a.cycle} attempt {a.attempt}"
            f"  {a.outcome}" + (f"  {a.duration_ms:.0f}ms" if a.duration_ms is not None else "")
            + ("" if a.retry_delay_s is None else
               f"  -> next retry cycle after {spoken(timedelta(seconds=a.retry_delay_s))}")
        )
        lines.extend(_error_text(a.error, stacks, "      "))
    for e in found.edits:
        lines.append(f"  edited {when(e.at)} by {e.actor} ({e.edit_id}, in {e.queue}/{e.source_table}); "
                     "original body:")
        original = render_body(e.original_body, e.encoding)
        lines.extend(f"    {line}" for line in original.text.splitlines() or [""])
    return "\n".join(lines)


def _place_detail(place: Location, now: datetime) -> str:
    if place.table == PROCESSED:
        return f": {place.disposition} at {when(place.arrived_at)} (from {place.from_table})"
    if place.table in (DEAD_LETTER, QUARANTINE):
        verb = "dead-lettered" if place.table == DEAD_LETTER else "quarantined"
        return f": {verb} ({place.reason}) at {when(place.arrived_at)} from {place.from_table}"
    if place.due_at is None:
        return ": waiting"
    due = "due now" if place.due_at <= now else f"due at {when(place.due_at)}"
    return f": waiting since {when(place.entered_at)}, {due}"
