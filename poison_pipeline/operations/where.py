"""A `--where` predicate (domain/predicates.py) as a pyarrow filter over a table of a known schema.

The filter is evaluated by pyarrow over the rows a selection reads anyway: vectorised, bounded in
time and memory by the table, and with the GIL released, so a lease's renewal thread keeps renewing
while it runs. Each literal is typed by the column it meets (a quoted time against a timestamp
column is an ISO 8601 time), and what cannot be compared is refused before any row is read.
"""

from __future__ import annotations

from decimal import Decimal
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from poison_pipeline.domain.durations import parse_time
from poison_pipeline.domain.predicates import (
    And,
    Between,
    Column,
    Comparison,
    InList,
    IsNull,
    Like,
    Literal,
    Not,
    Operand,
    Or,
    Predicate,
    PredicateError,
    Truth,
    parse_predicate,
)

_INT64 = (-(2**63), 2**63 - 1)
_NULL_BOOL = pa.scalar(None, pa.bool_())
_HOLDS = {"text": "text", "bytes": "bytes", "number": "numbers", "time": "times", "boolean": "booleans"}


def where_filter(text: str, schema: pa.Schema) -> pads.Expression:
    """The filter `text` says over rows of `schema`, or PredicateError naming what is wrong."""
    return _Compiler(schema).predicate(parse_predicate(text, schema.names))


def _kind(data_type: pa.DataType) -> str:
    """What a column or literal compares as."""
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "text"
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return "bytes"
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type):
        return "number"
    if pa.types.is_timestamp(data_type):
        return "time"
    if pa.types.is_boolean(data_type):
        return "boolean"
    return "other"


def _literal_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | Decimal):
        return "number"
    return "text"


class _Compiler:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def predicate(self, node: Predicate) -> pads.Expression:
        if isinstance(node, And):
            return reduce(lambda a, b: a & b, (self.predicate(p) for p in node.parts))
        if isinstance(node, Or):
            return reduce(lambda a, b: a | b, (self.predicate(p) for p in node.parts))
        if isinstance(node, Not):
            return ~self.predicate(node.operand)
        if isinstance(node, Comparison):
            left, right = self.pair(node.left, node.right, node.op)
            return {"=": left.__eq__, "!=": left.__ne__, "<": left.__lt__, "<=": left.__le__,
                    ">": left.__gt__, ">=": left.__ge__}[node.op](right)
        if isinstance(node, IsNull):
            operand = self.alone(node.operand)
            return ~operand.is_null() if node.negated else operand.is_null()
        if isinstance(node, InList):
            return self.in_list(node)
        if isinstance(node, Like):
            return self.like(node)
        if isinstance(node, Between):
            low, high = self.pair(node.operand, node.low, "BETWEEN"), self.pair(node.operand, node.high, "BETWEEN")
            inside = (low[0] >= low[1]) & (high[0] <= high[1])
            return ~inside if node.negated else inside
        if isinstance(node, Truth):
            if self.kind(node.operand) != "boolean":
                name = node.operand.name if isinstance(node.operand, Column) else repr(node.operand.value)
                raise PredicateError(f"{name} is not a condition: compare it (e.g. {name} = ...)", node.operand.at)
            return self.alone(node.operand)
        raise AssertionError(f"unknown predicate node {node!r}")

    # -- operands ----------------------------------------------------------------------------------

    def kind(self, operand: Operand) -> str:
        if isinstance(operand, Column):
            return _kind(self.schema.field(operand.name).type)
        return _literal_kind(operand.value)

    def alone(self, operand: Operand) -> pads.Expression:
        """An operand with nothing to type it by: a column, or a literal as it is written."""
        if isinstance(operand, Column):
            return pc.field(operand.name)
        if operand.value is None:
            return pc.scalar(pa.scalar(None, pa.null()))
        value = float(operand.value) if isinstance(operand.value, Decimal) else operand.value
        return pc.scalar(value)

    def pair(self, left: Operand, right: Operand, op: str) -> tuple[pads.Expression, pads.Expression]:
        """Both sides of a comparison, each literal typed by the column on the other side."""
        for side in (left, right):
            if isinstance(side, Literal) and side.value is None:
                raise PredicateError(f"{op} NULL is never true: write IS NULL or IS NOT NULL", side.at)
            if self.kind(side) == "other":
                assert isinstance(side, Column)
                raise PredicateError(f"column {side.name!r} ({self.schema.field(side.name).type}) can only be "
                                     "tested with IS [NOT] NULL", side.at)
        if isinstance(left, Column) and isinstance(right, Literal):
            return pc.field(left.name), self.typed(right, left)
        if isinstance(left, Literal) and isinstance(right, Column):
            return self.typed(left, right), pc.field(right.name)
        if self.kind(left) != self.kind(right):
            raise PredicateError(f"cannot compare {self.described(left)} with {self.described(right)}", right.at)
        return self.alone(left), self.alone(right)

    def described(self, operand: Operand) -> str:
        if isinstance(operand, Column):
            return f"column {operand.name!r} ({self.kind(operand)})"
        return f"{self.kind(operand)} {operand.value!r}"

    def typed(self, literal: Literal, column: Column) -> pads.Expression:
        return pc.scalar(self.scalar(literal, column))

    def scalar(self, literal: Literal, column: Column, number_type: pa.DataType | None = None) -> pa.Scalar:
        """`literal` as a value of `column`'s type, or PredicateError saying why it cannot be one."""
        data_type = self.schema.field(column.name).type
        kind, value = _kind(data_type), literal.value
        wrong = PredicateError(f"column {column.name!r} holds {_HOLDS.get(kind, kind)}: {_shown(value)} cannot "
                               f"be compared with it{_example(kind)}", literal.at)
        if value is None or isinstance(value, bool):
            if kind == "boolean" and value is not None:
                return pa.scalar(value, pa.bool_())
            raise wrong
        if kind == "text" and isinstance(value, str):
            return pa.scalar(value, pa.string())
        if kind == "bytes" and isinstance(value, str):
            return pa.scalar(value.encode("utf-8"), pa.binary())
        if kind == "time" and isinstance(value, str):
            try:
                moment = parse_time(value)
            except ValueError as error:
                raise PredicateError(f"column {column.name!r} is a time: {error}", literal.at) from None
            return pa.scalar(moment, data_type)
        if kind == "number" and isinstance(value, int | Decimal):
            if number_type is None:
                number_type = pa.int64() if isinstance(value, int) and pa.types.is_integer(data_type) \
                    else pa.float64()
            if pa.types.is_integer(number_type):
                if not (isinstance(value, int) and _INT64[0] <= value <= _INT64[1]):
                    raise PredicateError(f"{value} is out of the range of column {column.name!r}", literal.at)
                return pa.scalar(value, pa.int64())
            return pa.scalar(float(value), pa.float64())
        raise wrong

    def in_list(self, node: InList) -> pads.Expression:
        operand = node.operand
        if not isinstance(operand, Column):
            # Literals on both sides: the same rule as `=` between them, value by value.
            equal = [self.predicate(Comparison("=", operand, value)) for value in node.values]
            inside = reduce(lambda a, b: a | b, equal)
            return ~inside if node.negated else inside
        for value in node.values:
            if value.value is None:
                raise PredicateError("NULL in an IN list matches nothing: test IS NULL instead", value.at)
        number_type = None
        if self.kind(operand) == "number":
            whole = pa.types.is_integer(self.schema.field(operand.name).type)
            number_type = pa.int64() if whole and all(isinstance(v.value, int) for v in node.values) else pa.float64()
        scalars = [self.scalar(value, operand, number_type) for value in node.values]
        found = pc.field(operand.name).isin(pa.array([s.as_py() for s in scalars], scalars[0].type))
        # As SQL: a null value is in no list and outside none (the row is not selected either way).
        inside = pc.if_else(pc.field(operand.name).is_null(), pc.scalar(_NULL_BOOL), found)
        return ~inside if node.negated else inside

    def like(self, node: Like) -> pads.Expression:
        if self.kind(node.operand) not in ("text", "bytes"):
            raise PredicateError(f"LIKE compares text, not {self.described(node.operand)}", node.operand.at)
        assert isinstance(node.pattern.value, str)
        matched = pc.match_like(self.alone(node.operand), node.pattern.value)
        return ~matched if node.negated else matched


def _shown(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    return repr(value) if isinstance(value, str) else str(value)


def _example(kind: str) -> str:
    return {"text": " (quote it: 'text')", "bytes": " (quote it: 'text')",
            "time": " (an ISO 8601 time, quoted: '2026-11-22T10:00Z')", "number": " (a number: 3 or 2.5)",
            "boolean": " (TRUE or FALSE)"}.get(kind, "")
