"""What maintenance did, in words."""

from __future__ import annotations

from poison_pipeline.operations.maintenance import Maintained


def format_maintained(result: Maintained) -> str:
    vacuum = "not vacuumed" if result.retention_hours is None else f"vacuum retention {result.retention_hours:g} h"
    lines = [f"queue {result.queue!r}: maintained {len(result.tables)} table(s); {vacuum}"]
    for t in result.tables:
        if t.skipped:
            lines.append(f"  {t.table:<14} skipped: {t.skipped}")
        else:
            lines.append(f"  {t.table:<14} files {t.files_before} -> {t.files_after}, version "
                         f"{t.version_before} -> {t.version_after}, vacuumed {t.vacuumed_files}")
    return "\n".join(lines)
