"""Selection rules on tiny tables, no Spark and no Dagster: each filter alone, combined, and the
refusals that name what is wrong."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from poison_pipeline.operations.selection import Selection, SelectionError, selection_filter

DAY = [datetime(2030, 1, d, tzinfo=UTC) for d in (1, 2, 3)]
ROWS = pa.Table.from_pylist([
    {"message_id": "a", "message_type": "order", "last_error_type": "ValueError", "conversation_id": None,
     "dead_lettered_at": DAY[0]},
    {"message_id": "b", "message_type": "order", "last_error_type": "myapp.errors.PartObsolete",
     "conversation_id": "c", "dead_lettered_at": DAY[1]},
    {"message_id": "c", "message_type": "ship", "last_error_type": None, "conversation_id": "c",
     "dead_lettered_at": DAY[2]},
])


def taken(selection: Selection, table: str = "dead_letter") -> list[str]:
    expression = selection_filter(selection, table)
    rows = pads.dataset(ROWS).to_table(filter=expression) if expression is not None else ROWS
    return rows["message_id"].to_pylist()


@pytest.mark.parametrize(("selection", "expected"), [
    (Selection(), ["a", "b", "c"]),
    (Selection(error_type="ValueError"), ["a"]),
    (Selection(error_type="PartObsolete"), ["b"]),  # the short name of a qualified type
    (Selection(error_type="myapp.errors.PartObsolete"), ["b"]),
    (Selection(error_type="Obsolete"), []),  # a part of a name is not a name
    (Selection(message_type="order"), ["a", "b"]),
    (Selection(conversation="c"), ["b", "c"]),
    (Selection(failed_after=DAY[1]), ["b", "c"]),  # at or after
    (Selection(failed_before=DAY[1]), ["a"]),  # strictly before
    (Selection(ids=("a", "c", "zz")), ["a", "c"]),
    (Selection(message_type="order", conversation="c"), ["b"]),
    (Selection(failed_after=DAY[0], failed_before=DAY[2], ids=("a", "b", "c")), ["a", "b"]),
])
def test_each_filter_alone_and_combined(selection, expected):
    assert taken(selection) == expected


def test_the_failure_time_is_the_column_of_each_table():
    poison = ROWS.rename_columns(["message_id", "message_type", "last_error_type", "conversation_id", "entered_at"])
    expression = selection_filter(Selection(failed_after=DAY[2]), "poison")
    assert pads.dataset(poison).to_table(filter=expression)["message_id"].to_pylist() == ["c"]


def test_refusals_name_what_is_wrong():
    with pytest.raises(SelectionError, match="table 'inbound': choose poison, dead_letter or quarantine"):
        selection_filter(Selection(), "inbound")
    with pytest.raises(SelectionError, match="--failed-after .* is not before --failed-before .*: the range is empty"):
        selection_filter(Selection(failed_after=DAY[2], failed_before=DAY[1]), "dead_letter")


def test_arguments_are_json_values_of_the_filters_given():
    assert Selection(ids=("a",), failed_after=DAY[0], where="x = 1").arguments() == {
        "ids": ["a"], "failed_after": "2030-01-01T00:00:00+00:00", "where": "x = 1"}
