"""What an edit did, in words."""

from __future__ import annotations

from poison_pipeline.operations.edit import EditResult


def format_edit(result: EditResult) -> str:
    if result.already_done and result.abandoned:
        return (f"edit {result.edit_id} of message {result.message_id!r} was abandoned: killed before it recorded "
                "the new body, it changed nothing and a cycle closed it; nothing changed now (give another --id "
                "to edit it again)")
    if result.already_done:
        return (f"edit {result.edit_id} of message {result.message_id!r} already completed: nothing changed now "
                "(give another --id to edit it again)")
    size = f"{len(result.original_body or b'')} -> {len(result.new_body)} bytes"
    lines = [f"edit {result.edit_id}: message {result.message_id!r} in {result.queue}/{result.source}: body "
             f"replaced ({result.encoding}, {size}); sent back to {result.queue}/inbound "
             f"(redrive {result.redrive_id}, moved {result.moved})"]
    changed = {k: v for k, v in result.new_headers.items() if result.original_headers.get(k) != v}
    if changed:
        lines.append("  headers set: " + ", ".join(f"{k}={v}" for k, v in sorted(changed.items())))
    lines.append(f"  the original body is kept in {result.queue}/edits (see `inspect` and `history`)")
    return "\n".join(lines)
