"""`groups`: the failures of poison, dead-letter and quarantine grouped by error signature.

A group is the rows of one table of one queue that share a signature: error type, message with its
variable parts blanked and the innermost frame of the handler's own code (`domain.errors.describe`,
as ServicePulse and Wolverine group failed messages). Rows without an error (dead-lettered because
they expired, their conversation was ended, or they were rejected before any attempt) group by
their `reason` instead.

Each group has a short id, stable across runs and machines: the first 8 hex digits of its signature
(the signature `inspect` and the attempts ledger show), or for rows without an error, of
sha1("no-error:<reason>"). The same failure in two queues or tables has the same id: the id with a
queue and a table selects its rows there (`select_group`, `group_filter`), for `redrive` and `purge`.

Everything is read with delta-rs and pyarrow, no Spark: a scan of five narrow columns, then the
error columns of one example row per group.
"""

from __future__ import annotations

import functools
import operator
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.errors import GROUP_ID_LENGTH as ID_LENGTH
from poison_pipeline.domain.errors import NO_ERROR, NO_VALUE, frame_name, normalise, signature_of
from poison_pipeline.domain.errors import group_id as group_id
from poison_pipeline.domain.errors import group_key as group_key
from poison_pipeline.domain.routing import FAILED_AT, FAILURE_TABLES, POISON
from poison_pipeline.operations.actions import DONE, list_actions
from poison_pipeline.operations.archived import archived_mask
from poison_pipeline.storage.tables import QueueTables

# The tables whose rows are failures, and the column that says when each row failed (arrived there).
EXAMPLES = 3
SIGNATURE = "last_error_signature"

_GROUP_ID = re.compile(r"[0-9a-f]{8}")
_STACK_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line \d+, in (?P<function>.+)$', re.MULTILINE)


# The kind of action a note on a group is (operations/notes.py records it).
NOTE = "note"


@dataclass(frozen=True)
class GroupNote:
    """An operator's note on a failure group (`groups note`), the newest recorded in its queue."""

    text: str
    owner: str | None
    actor: str
    at: datetime
    action_id: str


class UnknownGroup(LookupError):  # noqa: N818 - reads as what the operator asked for
    """No row of the tables searched is in the group asked for (or the id is not a group id)."""

    def __init__(self, group_id: str, detail: str, *, gone: bool = False) -> None:
        super().__init__(f"failure group {group_id!r}: {detail}")
        self.group_id = group_id
        # A group id no table has rows of any more: its messages left (or it never failed here).
        self.gone = gone


@dataclass(frozen=True)
class FailureGroup:
    id: str
    queue: str
    table: str
    # The stored signature (16 hex digits); None for a group of rows without an error.
    signature: str | None
    # The signature's parts. `top_frame` is None when it cannot be recovered from the stored stack
    # (a signature written before the current rules, a worker that died).
    error_type: str | None
    error_message: str | None
    top_frame: str | None
    count: int
    first_failure_at: datetime | None
    last_failure_at: datetime | None
    message_types: dict[str, int]
    # Rows per `reason` (dead_letter, quarantine; empty for poison). A group without an error has one.
    reasons: dict[str, int]
    # The most recent failures first (up to three distinct message ids).
    example_ids: tuple[str, ...]
    # The first example's message as raised, before normalisation.
    example_error_message: str | None = None
    # The version of the table the group was read at: `id@version` selects only the rows present
    # then (`redrive --group`, `purge --group`, or `--as-of-version`).
    version: int | None = None
    note: GroupNote | None = None

    @property
    def as_of(self) -> str:
        """The group's id with the version it was read at: what an action given it takes."""
        return self.id if self.version is None else f"{self.id}@{self.version}"


def top_frame_of(error_type: str | None, message: str | None, stack: str | None, signature: str | None) -> str | None:
    """The top frame a stored signature was computed with, found among the stack's frames by
    recomputing the signature with each; None when no frame gives it."""
    if error_type is None or signature is None:
        return None
    # A KeyError recorded before its key was kept was signed with the key blanked.
    forms = dict.fromkeys((normalise(message or "", error_type), normalise(message or "")))
    candidates = [frame_name(m["file"], m["function"].strip()) for m in _STACK_FRAME.finditer(stack or "")]
    for candidate in [*reversed(candidates), ""]:
        for normalised in forms:
            if signature_of(error_type, normalised, candidate) == signature:
                return candidate
    return None


# -- grouping rows already read (pure: the unit tests call it on tiny tables) -------------------


@dataclass(frozen=True)
class _Summary:
    key: str
    count: int
    first: datetime | None
    last: datetime | None
    message_types: dict[str, int]
    reasons: dict[str, int]
    example_ids: tuple[str, ...]


def _column(rows: pa.Table, name: str) -> pa.ChunkedArray:
    if name in rows.column_names:
        return rows.column(name).cast(pa.string())
    return pa.chunked_array([pa.nulls(rows.num_rows, pa.string())])


def _keys(rows: pa.Table) -> pa.ChunkedArray:
    signatures = _column(rows, SIGNATURE)
    no_error = pc.binary_join_element_wise(NO_ERROR, pc.fill_null(_column(rows, "reason"), NO_VALUE), "")
    return pc.if_else(pc.is_valid(signatures), signatures, no_error)


def _counts_by(keys: pa.ChunkedArray, values: pa.ChunkedArray) -> dict[str, dict[str, int]]:
    pairs = pa.table({"key": keys, "value": pc.fill_null(values, NO_VALUE)})
    counted = pairs.group_by(["key", "value"]).aggregate([([], "count_all")])
    result: dict[str, dict[str, int]] = {}
    for key, value, count in zip(counted.column("key").to_pylist(), counted.column("value").to_pylist(),
                                 counted.column("count_all").to_pylist(), strict=True):
        result.setdefault(key, {})[value] = count
    return {key: dict(sorted(by.items())) for key, by in result.items()}


def summarise(rows: pa.Table, failed_at: str) -> list[_Summary]:
    """Group rows (message_id, message_type, last_error_signature, reason if the table has one, and
    the `failed_at` column) by key: count, first and last failure, message types, reasons, examples."""
    if rows.num_rows == 0:
        return []
    keys = _keys(rows)
    frame = pa.table({
        "key": keys,
        "at": rows.column(failed_at),
        "message_id": _column(rows, "message_id"),
    })
    order = pc.sort_indices(frame, sort_keys=[("key", "ascending", "at_end"), ("at", "descending", "at_end"),
                                              ("message_id", "ascending", "at_end")])
    frame = frame.take(order)
    sorted_keys = frame.column("key").combine_chunks()
    changes = pc.not_equal(sorted_keys.slice(1), sorted_keys.slice(0, len(sorted_keys) - 1))
    starts = [0, *(i + 1 for i in pc.indices_nonzero(changes).to_pylist())]
    ends = [*starts[1:], frame.num_rows]
    types = _counts_by(keys, _column(rows, "message_type"))
    reasons = _counts_by(keys, _column(rows, "reason")) if "reason" in rows.column_names else {}
    summaries = []
    for start, end in zip(starts, ends, strict=True):
        part = frame.slice(start, end - start)
        key = sorted_keys[start].as_py()
        times = part.column("at")
        examples: list[str] = []
        for message_id in part.column("message_id").to_pylist()[: EXAMPLES * 4]:
            if message_id is not None and message_id not in examples:
                examples.append(message_id)
        summaries.append(_Summary(
            key=key,
            count=part.num_rows,
            first=pc.min(times).as_py(),
            last=pc.max(times).as_py(),
            message_types=types.get(key, {}),
            reasons=reasons.get(key, {}),
            example_ids=tuple(examples[:EXAMPLES]),
        ))
    return summaries


def _error_rows(errors: pa.Table) -> dict[tuple[str, str], dict[str, str | None]]:
    """(message_id, signature) -> its error columns, from rows that have an error."""
    found: dict[tuple[str, str], dict[str, str | None]] = {}
    for row in errors.to_pylist():
        if row.get(SIGNATURE) is not None and row.get("message_id") is not None:
            found.setdefault((row["message_id"], row[SIGNATURE]), row)
    return found


def _group(queue: str, table: str, summary: _Summary,
           errors: dict[tuple[str, str], dict[str, str | None]]) -> FailureGroup:
    signature = None if summary.key.startswith(NO_ERROR) else summary.key
    error: dict[str, str | None] = {}
    if signature is not None:
        error = next((errors[(m, signature)] for m in summary.example_ids if (m, signature) in errors), {})
    kind, message = error.get("last_error_type"), error.get("last_error_message")
    return FailureGroup(
        id=group_id(summary.key),
        queue=queue,
        table=table,
        signature=signature,
        error_type=kind,
        error_message=None if message is None else normalise(message, kind),
        top_frame=top_frame_of(kind, message, error.get("last_error_stack"), signature),
        count=summary.count,
        first_failure_at=summary.first,
        last_failure_at=summary.last,
        message_types=summary.message_types,
        reasons=summary.reasons,
        example_ids=summary.example_ids,
        example_error_message=message,
    )


def _ordered(groups: list[FailureGroup]) -> list[FailureGroup]:
    """Biggest first, then the most recent; ties in a fixed order."""
    def order(group: FailureGroup) -> tuple[object, ...]:
        last = group.last_failure_at.timestamp() if group.last_failure_at is not None else float("-inf")
        return (-group.count, -last, group.queue, FAILURE_TABLES.index(group.table), group.id)

    return sorted(groups, key=order)


def group_rows(rows: pa.Table, queue: str, table: str) -> list[FailureGroup]:
    """The failure groups of rows already in memory (every column `failure_groups` reads, error
    columns included), biggest first."""
    summaries = summarise(rows, FAILED_AT[table])
    return _ordered([_group(queue, table, s, _error_rows(rows)) for s in summaries])


# -- reading the tables --------------------------------------------------------------------------


def _dataset(tables: QueueTables, table: str) -> pads.Dataset | None:
    if not tables.exists(table):
        return None
    return tables.open(table).to_pyarrow_dataset()


def _narrow(dataset: pads.Dataset, table: str) -> pa.Table:
    columns = ["message_id", "batch_id", "message_type", SIGNATURE, FAILED_AT[table]]
    if "reason" in dataset.schema.names:
        columns.append("reason")
    return dataset.to_table(columns=columns)


@dataclass(frozen=True)
class Window:
    """Failures at or after `since` and before `until` (either open)."""

    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"since {self.since.isoformat()} is not before until {self.until.isoformat()}: "
                             "no failure can fall between them")

    def mask(self, times: pa.ChunkedArray) -> pa.ChunkedArray | None:
        """Which of `times` fall in the window; None when the window is open on both sides."""
        conditions = [pc.greater_equal(times, pa.scalar(self.since, times.type)) if self.since else None,
                      pc.less(times, pa.scalar(self.until, times.type)) if self.until else None]
        given = [c for c in conditions if c is not None]
        if not given:
            return None
        # A row without a failure time falls in no window.
        return pc.fill_null(given[0] if len(given) == 1 else pc.and_(*given), False)


def _table_groups(tables: QueueTables, table: str, window: Window) -> list[FailureGroup]:
    opened = tables.open_if_exists(table)
    if opened is None:
        return []
    dataset = opened.to_pyarrow_dataset()
    narrow = _narrow(dataset, table)
    # Archived messages are known and ignored: they leave the groups.
    narrow = narrow.filter(pc.invert(archived_mask(tables, table, narrow)))
    in_window = window.mask(narrow.column(FAILED_AT[table]))
    if in_window is not None:
        narrow = narrow.filter(in_window)
    summaries = summarise(narrow, FAILED_AT[table])
    wanted = sorted({m for s in summaries if not s.key.startswith(NO_ERROR) for m in s.example_ids})
    errors: dict[tuple[str, str], dict[str, str | None]] = {}
    if wanted:
        # The error columns (stacks run to 8 kB) of the example rows only.
        errors = _error_rows(dataset.to_table(
            columns=["message_id", SIGNATURE, "last_error_type", "last_error_message", "last_error_stack"],
            filter=pc.field("message_id").isin(wanted),
        ))
    return [replace(_group(tables.queue, table, s, errors), version=opened.version()) for s in summaries]


def _scope(declaration: Declaration, queue: str | None, table: str | None) -> tuple[list[str], list[str]]:
    if queue is not None:
        declaration.queue(queue)  # KeyError naming the declared queues
    if table is not None and table not in FAILURE_TABLES:
        raise ValueError(f"table {table!r} holds no failures to group: choose {', '.join(FAILURE_TABLES)}")
    return ([queue] if queue is not None else list(declaration.queues),
            [table] if table is not None else list(FAILURE_TABLES))


def failure_groups(declaration: Declaration, queue: str | None = None,
                   table: str | None = None, *, window: Window = Window()) -> list[FailureGroup]:
    """The failure groups of poison, dead_letter and quarantine (or `table`) of every queue (or
    `queue`), biggest first, counting only the messages that failed in `window` (default: all);
    tables not created yet have none. KeyError for an undeclared queue, ValueError for a table
    that is not one of FAILURE_TABLES."""
    queues, names = _scope(declaration, queue, table)
    groups: list[FailureGroup] = []
    for name in queues:
        tables = QueueTables.of(declaration, name)
        notes = group_notes(declaration, name)
        for each in names:
            groups.extend(replace(g, note=notes.get(g.id)) for g in _table_groups(tables, each, window))
    return _ordered(groups)


def group_notes(declaration: Declaration, queue: str) -> dict[str, GroupNote]:
    """The newest note of each group of `queue` (by group id), from its actions ledger."""
    notes: dict[str, GroupNote] = {}
    for action in list_actions(declaration, queue):  # oldest first: the newest is kept
        if action.kind == NOTE and action.state == DONE:
            args = action.arguments
            notes[args["group"]] = GroupNote(args["text"], args.get("owner"), action.actor, action.at,
                                             action.action_id)
    return notes


# -- selecting a group's rows (redrive, purge) ---------------------------------------------------


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class GroupSelection:
    """The rows of one queue's table that are in a group: what `redrive` and `purge` act on."""

    group_id: str
    queue: str
    table: str
    # The group keys with this id in this table: a signature, or `no-error:<reason>`. One, unless
    # two signatures share their first 8 hex digits (then both are selected).
    keys: tuple[str, ...]
    rows: int
    expression: pads.Expression = field(compare=False)
    # The same selection as a SQL predicate over the table's columns, for delta-rs
    # (`DeltaTable.delete(predicate)`, `merge(...)`).
    predicate: str = ""


def key_expression(key: str, table: str) -> pads.Expression:
    """The rows of `table` whose group key is `key`, as a pyarrow dataset expression."""
    if not key.startswith(NO_ERROR):
        return pc.field(SIGNATURE) == key
    no_error = pc.field(SIGNATURE).is_null()
    if table == POISON:  # no reason column: every row without an error
        return no_error
    reason = key.removeprefix(NO_ERROR)
    return no_error & (pc.field("reason").is_null() if reason == NO_VALUE else pc.field("reason") == reason)


def key_predicate(key: str, table: str) -> str:
    """`key_expression` as a SQL predicate (delta-rs)."""
    if not key.startswith(NO_ERROR):
        return f"{SIGNATURE} = {_sql_text(key)}"
    if table == POISON:
        return f"{SIGNATURE} IS NULL"
    reason = key.removeprefix(NO_ERROR)
    return f"{SIGNATURE} IS NULL AND " + ("reason IS NULL" if reason == NO_VALUE else f"reason = {_sql_text(reason)}")


def _checked_id(group: str) -> str:
    wanted = group.strip().lower()
    if not _GROUP_ID.fullmatch(wanted):
        raise UnknownGroup(group, f"not a group id: group ids are {ID_LENGTH} hexadecimal characters, "
                                  "as `poison-pipeline groups` lists them")
    return wanted


def _key_counts(tables: QueueTables, table: str) -> Counter[str]:
    dataset = _dataset(tables, table)
    if dataset is None:
        return Counter()
    columns = [SIGNATURE, *(["reason"] if "reason" in dataset.schema.names else [])]
    keys = _keys(dataset.to_table(columns=columns))
    return Counter({item["values"]: item["counts"] for item in pc.value_counts(keys).to_pylist()})


def _selection(tables: QueueTables, table: str, wanted: str) -> GroupSelection:
    counts = _key_counts(tables, table)
    keys = tuple(sorted(k for k in counts if group_id(k) == wanted))
    expressions = [key_expression(key, table) for key in keys]
    expression = functools.reduce(operator.or_, expressions) if expressions else pc.scalar(False)
    predicates = [key_predicate(key, table) for key in keys]
    predicate = " OR ".join(f"({p})" for p in predicates) if len(predicates) > 1 else \
        (predicates[0] if predicates else "FALSE")
    return GroupSelection(wanted, tables.queue, table, keys, sum(counts[k] for k in keys), expression, predicate)


def locate_group(declaration: Declaration, group: str, queue: str | None = None,
                 table: str | None = None) -> list[GroupSelection]:
    """Where group `group` has rows: one selection per queue and table (within `queue` and `table`
    when given). UnknownGroup when it has none there, or `group` is not a group id."""
    wanted = _checked_id(group)
    queues, names = _scope(declaration, queue, table)
    found = []
    for name in queues:
        tables = QueueTables.of(declaration, name)
        for each in names:
            selection = _selection(tables, each, wanted)
            if selection.rows:
                found.append(selection)
    if not found:
        where = f"queue {queue!r}" if queue is not None else f"queues {', '.join(queues)}"
        raise UnknownGroup(group, f"no row of {', '.join(names)} in {where} is in this group "
                                  "(`poison-pipeline groups` lists the groups)", gone=True)
    return found


def select_group(declaration: Declaration, group: str, queue: str, table: str) -> GroupSelection:
    """The rows of `table` in `queue` that are in group `group`. UnknownGroup when none are (naming
    where the group does have rows, if anywhere), or `group` is not a group id; KeyError for an
    undeclared queue, ValueError for a table other than poison, dead_letter or quarantine."""
    wanted = _checked_id(group)
    _scope(declaration, queue, table)
    selection = _selection(QueueTables.of(declaration, queue), table, wanted)
    if selection.rows:
        return selection
    try:
        elsewhere = [f"{s.queue}/{s.table} ({s.rows})" for s in locate_group(declaration, wanted)]
    except UnknownGroup:
        elsewhere = []
    hint = f"; it has rows in {', '.join(elsewhere)}" if elsewhere else \
        "; no table has rows in it (`poison-pipeline groups` lists the groups)"
    raise UnknownGroup(group, f"no row of {table} in queue {queue!r} is in this group{hint}", gone=not elsewhere)


def group_filter(declaration: Declaration, group: str, queue: str, table: str) -> pads.Expression:
    """A pyarrow dataset expression over `table`'s columns selecting the rows of group `group` in
    `queue` (`select_group` says what it raises)."""
    return select_group(declaration, group, queue, table).expression


# -- for people -------------------------------------------------------------------------------
