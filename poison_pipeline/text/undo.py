"""What an undo did, in words."""

from __future__ import annotations

from poison_pipeline.operations.undo import UndoResult


def format_undo(result: UndoResult) -> str:
    """What the undo did, and which messages cannot come back and why (the CLI's text)."""
    if result.already_undone:
        return f"action {result.action_id} was undone already: nothing changed"
    lines = [f"undid {result.kind} {result.action_id} by {result.how} ({result.undo_id}): "
             f"{result.restored} message(s) back where they were"]
    for why, ids in result.unrecoverable_reasons.items():
        named = ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else "")
        lines.append(f"  {len(ids)} cannot come back: {why}: {named}")
    return "\n".join(lines)
