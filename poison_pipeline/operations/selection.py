"""Which failed messages an operator command takes from poison, dead_letter or quarantine: by
failure group, error type, message type, conversation, failure time, a list of ids or a predicate
over the table's columns (`--where`, parsed by domain/predicates.py, never SQL text). Read with
delta-rs and pyarrow only, so a small redrive or purge starts no JVM."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Self

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from pydantic import Field, field_validator, model_validator

from poison_pipeline.domain.bounds import bounded_count
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.durations import parse_time
from poison_pipeline.domain.predicates import PredicateError
from poison_pipeline.domain.routing import FAILED_AT, FAILURE_TABLES
from poison_pipeline.operations.archived import archived_mask
from poison_pipeline.operations.groups import UnknownGroup, group_filter
from poison_pipeline.operations.requests import Request, not_blank
from poison_pipeline.operations.where import where_filter
from poison_pipeline.storage.tables import QueueTables, schema_of


class SelectionError(ValueError):
    """A selection that cannot be applied; the message names the filter and what is wrong with it."""


@dataclass(frozen=True)
class Selection:
    group: str | None = None
    error_type: str | None = None
    message_type: str | None = None
    conversation: str | None = None
    failed_after: datetime | None = None
    failed_before: datetime | None = None
    ids: tuple[str, ...] | None = None
    where: str | None = None
    # The table's version the operator looked at: only rows present in it are taken.
    as_of_version: int | None = None
    # Archived rows are left out (None); True takes only them (restore, the archive's retention).
    archived: bool | None = None

    def arguments(self) -> dict[str, Any]:
        """The filters given, as JSON-able values (what an action records and an id derives from)."""
        given = {k: v for k, v in asdict(self).items() if v is not None}
        return {k: (v.isoformat() if isinstance(v, datetime) else list(v) if isinstance(v, tuple) else v)
                for k, v in given.items()}

    @classmethod
    def of_arguments(cls, arguments: dict[str, Any]) -> Selection:
        """The selection an action recorded with `arguments()`."""
        def at(key: str) -> datetime | None:
            return None if arguments.get(key) is None else datetime.fromisoformat(arguments[key])

        ids = arguments.get("ids")
        return cls(group=arguments.get("group"), error_type=arguments.get("error_type"),
                   message_type=arguments.get("message_type"), conversation=arguments.get("conversation"),
                   failed_after=at("failed_after"), failed_before=at("failed_before"),
                   ids=None if ids is None else tuple(ids), where=arguments.get("where"),
                   as_of_version=arguments.get("as_of_version"), archived=arguments.get("archived"))


class Filters(Request):
    """The filters of the actions that select failed messages (redrive, purge): all given must hold."""

    group: str | None = Field(default=None, description="A failure group id, as `groups` shows it (with "
                              "`@VERSION`: only the messages present in that version of the table).")
    error_type: str | None = Field(default=None, description="The last error's type: ValueError, or "
                                   "PartObsolete for myapp.errors.PartObsolete.")
    message_type: str | None = Field(default=None, description="The messages' message_type.")
    conversation: str | None = Field(default=None, description="A conversation id.")
    failed_after: str | None = Field(default=None, description="ISO 8601; failed at or after (UTC when no "
                                     "zone is given).")
    failed_before: str | None = Field(default=None, description="ISO 8601; failed before.")
    ids: list[str] | None = Field(default=None, description="Only these message ids.")
    where: str | None = Field(default=None, description="A predicate over the table's columns: = != < <= > "
                              ">=, IN (...), LIKE, IS [NOT] NULL, BETWEEN, AND, OR, NOT, parentheses (no SQL "
                              "beyond these).")
    as_of_version: int | None = Field(default=None, ge=0, description="Only the messages present in this "
                                      "version of the source table (what `groups` read): none that failed since.")

    @field_validator("group", "error_type", "message_type", "conversation", "where")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        return not_blank(value)

    @field_validator("failed_after", "failed_before")
    @classmethod
    def _moment(cls, value: str | None) -> str | None:
        if value is not None:
            parse_time(value)
        return value

    @field_validator("group")
    @classmethod
    def _group_and_version(cls, value: str | None) -> str | None:
        if value is not None and "@" in value:
            version = value.rpartition("@")[2]
            if not version.isdigit():
                raise ValueError(f"{value!r}: write a group id, or a group id and the version `groups` read "
                                 "(3fe6b38b@12)")
            try:
                bounded_count(int(version))
            except ValueError as error:
                raise ValueError(f"{value!r}: version {error}") from None
        return value

    @field_validator("as_of_version")
    @classmethod
    def _bounded_version(cls, value: int | None) -> int | None:
        return None if value is None else bounded_count(value)

    @model_validator(mode="after")
    def _one_version(self) -> Self:
        group_version = self.group_version
        if group_version is not None and self.as_of_version not in (None, group_version):
            raise ValueError(f"the group {self.group!r} was read at version {group_version}, not at "
                             f"as_of_version {self.as_of_version}: give one of them")
        return self

    @property
    def group_version(self) -> int | None:
        """The version a group id written `id@VERSION` carries."""
        return None if self.group is None or "@" not in self.group else int(self.group.rpartition("@")[2])

    def selection(self) -> Selection:
        """The selection these filters make."""
        group = None if self.group is None else self.group.partition("@")[0]
        version = self.as_of_version if self.as_of_version is not None else self.group_version
        return Selection(group=group, error_type=self.error_type, message_type=self.message_type,
                         conversation=self.conversation, failed_after=_time(self.failed_after),
                         failed_before=_time(self.failed_before),
                         ids=None if self.ids is None else tuple(self.ids), where=self.where, as_of_version=version)

    def within(self, start: datetime, end: datetime) -> Self:
        """These filters narrowed to failures from `start` to before `end` (a day's partition)."""
        after = max(t for t in (start, _time(self.failed_after)) if t is not None)
        before = min(t for t in (end, _time(self.failed_before)) if t is not None)
        return self.model_copy(update={"failed_after": after.isoformat(), "failed_before": before.isoformat()})


def _time(text: str | None) -> datetime | None:
    return None if text is None else parse_time(text)


def check_table(table: str) -> None:
    if table not in FAILURE_TABLES:
        raise SelectionError(f"table {table!r}: choose poison, dead_letter or quarantine")


def selection_filter(selection: Selection, table: str) -> pads.Expression | None:
    """The row filter of every selection but `group` (it reads the table: `selected`)."""
    check_table(table)
    if selection.failed_after and selection.failed_before and selection.failed_after >= selection.failed_before:
        raise SelectionError(f"--failed-after {selection.failed_after.isoformat()} is not before "
                             f"--failed-before {selection.failed_before.isoformat()}: the range is empty")
    parts: list[pads.Expression] = []
    if selection.error_type is not None:
        # `ValueError` matches builtins' ValueError; `PartObsolete` also matches myapp.errors.PartObsolete.
        error = pc.field("last_error_type")
        parts.append((error == selection.error_type) | pc.ends_with(error, "." + selection.error_type))
    if selection.message_type is not None:
        parts.append(pc.field("message_type") == selection.message_type)
    if selection.conversation is not None:
        parts.append(pc.field("conversation_id") == selection.conversation)
    failed_at = pc.field(FAILED_AT[table])
    if selection.failed_after is not None:
        parts.append(failed_at >= pa.scalar(selection.failed_after, pa.timestamp("us", tz="UTC")))
    if selection.failed_before is not None:
        parts.append(failed_at < pa.scalar(selection.failed_before, pa.timestamp("us", tz="UTC")))
    if selection.ids is not None:
        parts.append(pc.field("message_id").isin(list(selection.ids)))
    if selection.where is not None:
        parts.append(_where(table, selection.where))
    if not parts:
        return None
    combined = parts[0]
    for part in parts[1:]:
        combined = combined & part
    return combined


def selected(declaration: Declaration, queue: str, table: str, selection: Selection) -> pa.Table:
    """The rows of `queue`'s `table` the selection takes, every column, oldest failure first."""
    return selected_at(declaration, queue, table, selection)[0]


def selected_at(declaration: Declaration, queue: str, table: str, selection: Selection) -> tuple[pa.Table, int | None]:
    """`selected`, and the version of the table it read (None: the table does not exist yet); with
    `as_of_version`, that version: the rows taken are those it held."""
    check_table(table)
    schema = schema_of(table)
    tables = QueueTables.of(declaration, queue)
    if not tables.exists(table):
        return schema.empty_table(), None
    target = tables.open(table)
    expression = selection_filter(selection, table)
    if selection.group is not None:
        try:
            in_group = group_filter(declaration, selection.group, queue, table)
        except UnknownGroup as error:
            if error.gone:  # nothing to take, as for any filter that selects no row
                return schema.empty_table(), target.version()
            raise SelectionError(f"--group {error}") from None
        expression = in_group if expression is None else expression & in_group
    # pyarrow evaluates the filter as it scans, releasing the GIL: the lease renewal keeps running.
    rows = target.to_pyarrow_dataset().to_table(filter=expression) if expression is not None \
        else target.to_pyarrow_table()
    if selection.as_of_version is not None:
        rows = rows.filter(_in_snapshot(tables, table, target.version(), selection.as_of_version, rows))
    archived = archived_mask(tables, table, rows)
    rows = rows.filter(archived if selection.archived else pc.invert(archived))
    version = target.version() if selection.as_of_version is None else selection.as_of_version
    return rows.cast(schema).sort_by([(FAILED_AT[table], "ascending"), ("message_id", "ascending")]), version


def _in_snapshot(tables: QueueTables, table: str, current: int, version: int, rows: pa.Table) -> pa.Array:
    """Which of `rows` (read now) were in `table` at `version` already: the same message in the same
    batch. A message that failed again since is in another batch: it is not taken."""
    if version > current:
        raise SelectionError(f"--as-of-version {version}: {tables.describe(table)} is at version {current}")
    try:
        then = tables.open(table)
        then.load_as_version(version)
        seen = then.to_pyarrow_dataset().to_table(columns=["message_id", "batch_id"])
    except Exception as error:  # noqa: BLE001 - vacuumed, or its log entry cleaned up: say which version
        raise SelectionError(f"--as-of-version {version}: {tables.describe(table)} cannot be read at that "
                             f"version any more ({error})") from None

    def keys(part: pa.Table) -> pa.Array:
        return pc.binary_join_element_wise(part["message_id"], pc.fill_null(part["batch_id"], ""), "\x00")

    return pc.is_in(keys(rows), value_set=keys(seen))


def check_where(table: str, where: str | None) -> None:
    """Raise SelectionError for a `--where` that is not a predicate over `table`'s columns, reading
    no rows: before anything is written or the lease is taken."""
    check_table(table)
    if where is not None:
        _where(table, where)


def _where(table: str, where: str) -> pads.Expression:
    try:
        return where_filter(where, schema_of(table))
    except PredicateError as error:
        raise SelectionError(f"--where {where!r} is not a predicate over the columns of {table}: {error}") from None
