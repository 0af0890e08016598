"""The asset checks of a queue as plain functions: each reads Delta logs or one narrow column, no Spark.
What each reads is kept until one of the tables it read changes (storage/memo.py): an evaluation
that finds nothing changed costs a request per table, whatever the tables' history.

- conservation (error): what the queue ever accepted (the intake ledger) equals what it accounts for
  (the conservation line: waiting, failed, terminal and purged);
- one_place (error): no message id in two waiting or failure tables at once;
- poison_growth, dead_letter_growth (warning): growth since the previous check over a threshold;
- depth (per failure table, warning or error): messages there (archived ones left out) at a level;
- oldest_waiting (per waiting table, warning or error): a message due for longer than a level.

A check with two levels fails at the higher one it reaches (`reached`): yellow in the asset graph at
`warn`, red at `error`, green once the messages leave.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from poison_pipeline.domain.declaration import AgeLevels, DepthLevels
from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND, POISON, QUARANTINE
from poison_pipeline.operations.archived import archived_count
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.storage.intake import accepted_total, ensure_intake
from poison_pipeline.storage.memo import remembered
from poison_pipeline.storage.message_ids import message_ids
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import LeaseFreeAppender

CONSERVATION = "conservation"
ONE_PLACE = "one_place"
POISON_GROWTH = "poison_growth"
DEAD_LETTER_GROWTH = "dead_letter_growth"
OLDEST_WAITING = "oldest_waiting"
DEPTH = "depth"
# What each growth check watches: the poison path is poison plus what its reader quarantined.
GROWTH_TABLES: dict[str, tuple[str, ...]] = {POISON_GROWTH: (POISON, QUARANTINE),
                                             DEAD_LETTER_GROWTH: (DEAD_LETTER,)}
SAMPLE = 20


class Severity(StrEnum):
    ERROR = "error"
    WARN = "warn"


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    table: str  # the table (asset) the check is about
    severity: Severity
    passed: bool
    description: str
    metadata: dict[str, int | float | str | list[str] | None] = field(default_factory=dict)


def _outcome_of(kept: dict[str, object]) -> CheckOutcome:
    return CheckOutcome(**{**kept, "severity": Severity(kept["severity"])})  # type: ignore[arg-type]


def check_conservation(tables: QueueTables) -> CheckOutcome:
    return remembered(tables, CONSERVATION, _conservation, asdict, _outcome_of)


def _conservation(tables: QueueTables) -> CheckOutcome:
    accepted = accepted_total(tables)
    if accepted is None:
        ensure_intake(LeaseFreeAppender(tables))  # a lake older than the intake ledger: its opening balance starts it
        accepted = accepted_total(tables) or 0
    line = conservation(tables)
    terms: dict[str, int | float | str | list[str] | None] = {
        **{f"ledger_{kind}": n for kind, n in sorted(line.ledger.items())},
        "waiting": line.waiting, "poison": line.poison, "dead_letter": line.dead_letter,
        "quarantined": line.quarantined, "archived": line.archived, "purged": line.purged,
    }
    difference = line.accounted - accepted
    if difference == 0:
        description = f"all {accepted} accepted messages are accounted for"
    elif difference < 0:
        description = f"{-difference} of {accepted} accepted messages are nowhere (lost)"
    else:
        description = f"{difference} more messages accounted for than were ever accepted ({accepted})"
    return CheckOutcome(CONSERVATION, INBOUND, Severity.ERROR, difference == 0, description, {
        "accepted": accepted, "accounted": line.accounted, "difference": difference, **terms,
        "line": line.line(received=accepted)})


def check_one_place(tables: QueueTables) -> CheckOutcome:
    return remembered(tables, ONE_PLACE, _one_place, asdict, _outcome_of)


def _one_place(tables: QueueTables) -> CheckOutcome:
    # A table may hold one id twice (enqueued twice, the later one a duplicate-to-be); two tables may not.
    watched = (*tables.waiting, DEAD_LETTER, QUARANTINE)
    ids = {table: message_ids(tables, table) for table in watched}
    # Hashing every id of the largest table (inbound, usually) would cost ten times reading them: only
    # the other tables' ids are hashed, and the largest one is probed against them.
    largest = max(watched, key=lambda t: len(ids[t]))
    others = [t for t in watched if t != largest]
    distinct = {t: pc.unique(ids[t]) for t in others}
    rest = pa.concat_arrays([distinct[t] for t in others])
    counts = pc.value_counts(rest)
    between_others = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    in_largest = pc.unique(ids[largest].filter(pc.is_in(ids[largest], value_set=counts.field("values"))))
    twice = sorted(set(between_others.to_pylist()) | set(in_largest.to_pylist()))
    shown = twice[:SAMPLE]
    # Where they are is looked up for the sample only: a healthy queue has none to look up.
    sample = [f"{mid}: {', '.join(t for t in watched if pc.any(pc.equal(ids[t], mid)).as_py())}" for mid in shown]
    checked = sum(len(a) for a in ids.values())
    description = (f"every one of {checked} message ids is in one table" if not twice else
                   f"{len(twice)} message id(s) in two tables at once, e.g. {sample[0]}")
    return CheckOutcome(ONE_PLACE, INBOUND, Severity.ERROR, not twice, description, {
        "ids_checked": checked, "in_two_places": len(twice), "sample": sample})


def check_growth(tables: QueueTables, name: str, threshold: int, previous: int | None) -> CheckOutcome:
    """Net growth of the watched tables' rows since `previous` (the last check's count; none: from 0)."""
    watched = GROWTH_TABLES[name]
    # Archived messages are known and ignored: they leave the count, as they leave the groups.
    counts: dict[str, int] = remembered(tables, name, lambda read: {
        table: read.open(table).count() - archived_count(read, table) if read.exists(table) else 0
        for table in watched}, dict, dict)
    rows = sum(counts.values())
    growth = rows - (previous or 0)
    since = "since the previous check" if previous is not None else "with no earlier check"
    description = (f"{growth:+d} messages in {' + '.join(watched)} {since} (threshold {threshold}); "
                   f"{rows} there now")
    return CheckOutcome(name, watched[0], Severity.WARN, growth <= threshold, description, {
        "rows": rows, "previous": previous, "growth": growth, "threshold": threshold,
        **{f"rows_{table}": n for table, n in counts.items()}})


def reached(value: float, warn: float | None, error: float | None, *, inclusive: bool) -> Severity | None:
    """The highest level `value` reaches (at it when `inclusive`, else past it); None: neither."""
    def past(level: float | None) -> bool:
        return level is not None and (value >= level if inclusive else value > level)

    return Severity.ERROR if past(error) else Severity.WARN if past(warn) else None


def check_depth(tables: QueueTables, table: str, levels: DepthLevels) -> CheckOutcome:
    """How many messages the failure table holds (archived ones left out), against its levels."""
    rows: int = remembered(tables, f"{DEPTH}-{table}", lambda read: (
        read.open(table).count() - archived_count(read, table) if read.exists(table) else 0), int, int)
    level = reached(rows, levels.warn, levels.error, inclusive=True)
    description = f"{rows} message(s) in {table} ({levels.described()})"
    if level is not None:
        description += f": at the {level.value} level; `poison-pipeline groups` says why they failed"
    return CheckOutcome(DEPTH, table, level or _top(levels.error), level is None, description, {
        "messages": rows, "warn": levels.warn, "error": levels.error})


def _top(error: object) -> Severity:
    """The severity a passing check is shown with: the highest it can fail at."""
    return Severity.WARN if error is None else Severity.ERROR


def check_oldest_waiting(tables: QueueTables, table: str, levels: AgeLevels,
                         now: datetime | None = None) -> CheckOutcome:
    """How long the table's oldest due message has been due, from the log's due_at statistics."""
    now = now or datetime.now(UTC)
    due = remembered(tables, f"{OLDEST_WAITING}-{table}", lambda read: _oldest_due(read, table),
                     lambda at: None if at is None else at.isoformat(),
                     lambda kept: None if kept is None else datetime.fromisoformat(kept))
    age = max((now - due).total_seconds(), 0.0) if due is not None and due <= now else 0.0
    level = reached(age, _seconds(levels.warn), _seconds(levels.error), inclusive=False)
    thresholds = levels.described()
    if due is None or due > now:
        description = f"no message is due ({thresholds})"
    else:
        description = (f"the oldest due message has waited {timedelta(seconds=round(age))} since it was due "
                       f"({thresholds})")
    if level is not None:
        description += (f": at the {level.value} level; is the queue disabled, its sensor stopped, or its cycles "
                        "failing?")
    return CheckOutcome(OLDEST_WAITING, table, level or _top(levels.error), level is None, description, {
        "oldest_due_age_s": round(age, 3), "warn_s": _seconds(levels.warn), "error_s": _seconds(levels.error),
        "oldest_due_at": due.isoformat() if due is not None else None})


def _seconds(level: timedelta | None) -> float | None:
    return None if level is None else level.total_seconds()


def _oldest_due(tables: QueueTables, table: str) -> datetime | None:
    if not tables.exists(table):
        return None
    actions = pa.table(tables.open(table).get_add_actions(flatten=True))
    if actions.num_rows == 0 or "min.due_at" not in actions.column_names:
        return None
    oldest: datetime | None = pc.min(actions["min.due_at"]).as_py()
    return oldest
