"""The conservation line: every message that came in is in exactly one place or terminal ledger."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow.compute as pc

from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, POISON, PROCESSED, QUARANTINE
from poison_pipeline.operations.archived import archived_count
from poison_pipeline.storage.tables import PURGED, QueueTables


@dataclass(frozen=True)
class Conservation:
    queue: str
    waiting: int
    poison: int
    dead_letter: int
    quarantined: int
    ledger: dict[str, int] = field(default_factory=dict)
    # Deleted for good by `purge` or a declared retention: a terminal outcome of its own (the purged
    # ledger keeps their ids), so the line still balances after a purge.
    purged: int = 0
    # Failed messages an operator archived: still in their failure table, counted here instead.
    archived: int = 0

    @property
    def accounted(self) -> int:
        return (self.waiting + self.poison + self.dead_letter + self.quarantined + self.archived + self.purged
                + sum(self.ledger.values()))

    def line(self, received: int | None = None) -> str:
        # The usual dispositions always, and any other the ledger holds: the terms add up to the total.
        usual = ("processed", "dropped", "duplicate")
        kinds = [*usual, *sorted((k for k in self.ledger if k not in usual), key=str)]
        ledger = " + ".join(f"{self.ledger.get(k, 0)} {k}" for k in kinds)
        left = f"in {received}" if received is not None else "accounted"
        verdict = "" if received is None else ("  OK" if received == self.accounted else "  MISMATCH")
        return (
            f"{self.queue}: {left} = {ledger} + {self.waiting} waiting + {self.poison} poison + "
            f"{self.dead_letter} dead-letter + {self.quarantined} quarantined + {self.archived} archived + "
            f"{self.purged} purged"
            f" (= {self.accounted}){verdict}"
        )


def conservation(tables: QueueTables) -> Conservation:
    """Counts from the Delta logs, plus the ledger's disposition column (one narrow column)."""
    rows = {table: tables.open(table).count() for table in tables.waiting}
    dispositions = tables.open(PROCESSED).to_pyarrow_table(columns=["disposition"])["disposition"]
    counts = pc.value_counts(dispositions).to_pylist()
    archived = {table: archived_count(tables, table) for table in FAILURE_TABLES}
    return Conservation(
        queue=tables.queue,
        waiting=sum(n for t, n in rows.items() if t != POISON),
        poison=rows[POISON] - archived[POISON],
        dead_letter=tables.open(DEAD_LETTER).count() - archived[DEAD_LETTER],
        quarantined=tables.open(QUARANTINE).count() - archived[QUARANTINE],
        archived=sum(archived.values()),
        ledger=dict(Counter({c["values"]: c["counts"] for c in counts})),
        # A lake made before purge existed has no purged ledger yet: nothing was purged.
        purged=tables.open(PURGED).count() if tables.exists(PURGED) else 0,
    )
