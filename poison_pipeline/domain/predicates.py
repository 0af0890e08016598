"""The predicate grammar of `--where` (and the operator jobs' `where`): a small SQL-like expression
over a table's columns, parsed into a tiny tree that `operations.where` turns into a pyarrow filter.

The grammar, nothing else (keywords in any case; `column` is one of the table's columns):

    predicate  := disjunct (OR disjunct)*
    disjunct   := negation (AND negation)*
    negation   := NOT negation | test
    test       := '(' predicate ')'
                | operand (= | != | <> | < | <= | > | >=) operand
                | operand IS [NOT] NULL
                | operand [NOT] IN '(' literal (',' literal)* ')'
                | operand [NOT] LIKE 'pattern'
                | operand [NOT] BETWEEN operand AND operand
                | operand
    operand    := column | literal
    literal    := 'text' ('' inside is one quote) | [-]integer | [-]decimal | TRUE | FALSE | NULL

It is text an operator types, so it is never handed to an engine that could do more: no function
calls, subqueries, SELECT or UNION, no comments and no `;` (a refusal names what and where). Its
size is bounded (text, string literals, nesting, nodes), so parsing it is bounded too.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from decimal import Decimal

MAX_TEXT = 4096
MAX_STRING = 1024
MAX_DEPTH = 32  # parentheses and NOTs nested; far below Python's recursion limit
MAX_NODES = 512
MAX_DIGITS = 38  # an integer or decimal literal: beyond this no column of ours holds it


class PredicateError(ValueError):
    """Not a predicate of the grammar; `at` is the 1-based character the problem starts at, if any."""

    def __init__(self, message: str, at: int | None = None) -> None:
        self.at = at
        super().__init__(f"{message} at character {at}" if at is not None else message)


@dataclass(frozen=True)
class Column:
    name: str
    at: int


@dataclass(frozen=True)
class Literal:
    value: str | int | Decimal | bool | None
    at: int


Operand = Column | Literal


@dataclass(frozen=True)
class Comparison:
    op: str  # one of =, !=, <, <=, >, >= (<> is read as !=)
    left: Operand
    right: Operand


@dataclass(frozen=True)
class IsNull:
    operand: Operand
    negated: bool


@dataclass(frozen=True)
class InList:
    operand: Operand
    values: tuple[Literal, ...]
    negated: bool


@dataclass(frozen=True)
class Like:
    operand: Operand
    pattern: Literal  # a string: % any run of characters, _ one character, \ escapes the next
    negated: bool


@dataclass(frozen=True)
class Between:
    operand: Operand
    low: Operand
    high: Operand
    negated: bool


@dataclass(frozen=True)
class And:
    parts: tuple[Predicate, ...]  # two or more; flat, so a long chain nests no deeper


@dataclass(frozen=True)
class Or:
    parts: tuple[Predicate, ...]


@dataclass(frozen=True)
class Not:
    operand: Predicate


@dataclass(frozen=True)
class Truth:
    """A lone operand used as a predicate (a boolean column, TRUE or FALSE)."""

    operand: Operand


Predicate = Comparison | IsNull | InList | Like | Between | And | Or | Not | Truth

_KEYWORDS = frozenset({"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "BETWEEN", "TRUE", "FALSE"})
_COMPARISONS = ("<=", ">=", "!=", "<>", "=", "<", ">")
# SQL that is not part of the grammar, named as such rather than as an unknown column.
_SQL_WORDS = frozenset({"SELECT", "FROM", "UNION", "EXCEPT", "INTERSECT", "EXISTS", "WHERE", "WITH", "JOIN",
                        "ORDER", "GROUP", "HAVING", "LIMIT", "CASE", "CAST", "ALL", "ANY", "SOME", "VALUES"})


@dataclass(frozen=True)
class _Token:
    kind: str  # "name", "keyword", "string", "number", "op", "(", ")", ",", "end"
    text: str
    at: int  # 1-based
    value: str | int | Decimal | None = None


_DIGITS = frozenset("0123456789")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _tokens(text: str) -> Iterator[_Token]:
    """The tokens of `text`, read as the parser asks for them: a refusal names the first problem."""
    i = 0
    while i < len(text):
        char, at = text[i], i + 1
        if char.isspace():
            i += 1
        elif text.startswith("--", i) or text.startswith("/*", i):
            raise PredicateError(f"comments ({text[i:i + 2]!r}) are not part of a predicate", at)
        elif char == ";":
            raise PredicateError("one predicate only: unexpected ';'", at)
        elif char == "'":
            value, i = _string(text, i)
            yield _Token("string", text[at - 1:i], at, value)
        elif char in _DIGITS or (char == "." and text[i + 1:i + 2] in _DIGITS):
            number = _NUMBER.match(text, i)
            assert number is not None  # a digit, or a dot before one, starts a match
            i = number.end()
            if i < len(text) and (text[i].isalnum() or text[i] in "_."):
                raise PredicateError(f"unexpected {text[i]!r} in a number (write integers or decimals "
                                     "like 3 or 2.5)", i + 1)
            digits = number.group()
            if sum(c.isdigit() for c in digits) > MAX_DIGITS:
                raise PredicateError(f"a number of more than {MAX_DIGITS} digits", at)
            yield _Token("number", digits, at, Decimal(digits) if "." in digits else int(digits))
        elif char.isascii() and (char.isalpha() or char == "_"):
            name = _NAME.match(text, i)
            assert name is not None
            i = name.end()
            word = name.group()
            kind = "keyword" if word.upper() in _KEYWORDS else "name"
            yield _Token(kind, word.upper() if kind == "keyword" else word, at)
        elif char in "(),":
            yield _Token(char, char, at)
            i += 1
        elif (op := next((o for o in _COMPARISONS if text.startswith(o, i)), None)) is not None:
            yield _Token("op", op, at)
            i += len(op)
        elif char == "-":
            yield _Token("op", "-", at)
            i += 1
        else:
            raise PredicateError(f"unexpected {char!r}", at)
    while True:
        yield _Token("end", "", len(text) + 1)


def _string(text: str, start: int) -> tuple[str, int]:
    """The quoted string starting at `start`, and the index after its closing quote."""
    parts: list[str] = []
    i = start + 1
    while True:
        end = text.find("'", i)
        if end < 0:
            raise PredicateError("unterminated string (a quote inside is written '')", start + 1)
        parts.append(text[i:end])
        if text.startswith("''", end):
            parts.append("'")
            i = end + 2
            continue
        value = "".join(parts)
        if len(value) > MAX_STRING:
            raise PredicateError(f"a string of more than {MAX_STRING} characters", start + 1)
        return value, end + 1


class _Parser:
    def __init__(self, text: str, columns: Collection[str]) -> None:
        self.lexer = _tokens(text)
        self.token = next(self.lexer)
        self.depth = 0
        self.nodes = 0
        self.columns = {c.lower(): c for c in columns}

    # -- tokens ------------------------------------------------------------------------------------

    def take(self) -> _Token:
        token, self.token = self.token, next(self.lexer)
        return token

    def is_keyword(self, *words: str) -> bool:
        return self.token.kind == "keyword" and self.token.text in words

    def expect_keyword(self, word: str, after: str) -> None:
        if not self.is_keyword(word):
            raise self.unexpected(f"{word} after {after}")
        self.take()

    def expect(self, kind: str, after: str) -> _Token:
        if self.token.kind != kind:
            raise self.unexpected(f"{kind!r} after {after}")
        return self.take()

    def unexpected(self, wanted: str | None = None) -> PredicateError:
        token = self.token
        what = "end of text" if token.kind == "end" else repr(token.text)
        hint = f" (expected {wanted})" if wanted else ""
        return PredicateError(f"unexpected {what}{hint}", token.at)

    def node(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise PredicateError(f"more than {MAX_NODES} terms", self.token.at)

    # -- grammar -----------------------------------------------------------------------------------

    def predicate(self) -> Predicate:
        parts = [self.disjunct()]
        while self.is_keyword("OR"):
            self.take()
            parts.append(self.disjunct())
        return parts[0] if len(parts) == 1 else Or(tuple(parts))

    def disjunct(self) -> Predicate:
        parts = [self.negation()]
        while self.is_keyword("AND"):
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def negation(self) -> Predicate:
        if self.is_keyword("NOT"):
            at = self.take().at
            self.node()
            with _Nested(self, at):
                return Not(self.negation())
        return self.test()

    def test(self) -> Predicate:
        if self.token.kind == "(":
            at = self.take().at
            with _Nested(self, at):
                inner = self.predicate()
            self.expect(")", "a parenthesised predicate")
            return inner
        operand = self.operand()
        self.node()
        if self.token.kind == "op" and self.token.text in _COMPARISONS:
            op = self.take().text
            return Comparison("!=" if op == "<>" else op, operand, self.operand())
        if self.is_keyword("IS"):
            self.take()
            negated = self.is_keyword("NOT")
            if negated:
                self.take()
            self.expect_keyword("NULL", "IS" + (" NOT" if negated else ""))
            return IsNull(operand, negated)
        negated = self.is_keyword("NOT")
        if negated:
            self.take()
            if not self.is_keyword("IN", "LIKE", "BETWEEN"):
                raise self.unexpected("IN, LIKE or BETWEEN after NOT")
        if self.is_keyword("IN"):
            self.take()
            return InList(operand, self.literal_list(), negated)
        if self.is_keyword("LIKE"):
            self.take()
            pattern = self.operand()
            if not (isinstance(pattern, Literal) and isinstance(pattern.value, str)):
                raise PredicateError("LIKE takes a quoted pattern ('ORD-%')", pattern.at)
            return Like(operand, pattern, negated)
        if self.is_keyword("BETWEEN"):
            self.take()
            low = self.operand()
            self.expect_keyword("AND", "BETWEEN's lower bound")
            return Between(operand, low, self.operand(), negated)
        return Truth(operand)

    def literal_list(self) -> tuple[Literal, ...]:
        self.expect("(", "IN")
        values: list[Literal] = []
        while True:
            value = self.operand()
            if not isinstance(value, Literal):
                raise PredicateError(f"IN takes literals only, not the column {value.name!r}", value.at)
            self.node()
            values.append(value)
            if self.token.kind == ")":
                self.take()
                return tuple(values)
            self.expect(",", "a value of IN's list")

    def operand(self) -> Operand:
        token = self.token
        if token.kind == "string":
            self.take()
            assert isinstance(token.value, str)
            return Literal(token.value, token.at)
        if token.kind == "number":
            self.take()
            assert isinstance(token.value, int | Decimal)
            return Literal(token.value, token.at)
        if token.kind == "op" and token.text == "-":
            self.take()
            number = self.token
            if number.kind != "number":
                raise self.unexpected("a number after '-'")
            self.take()
            assert isinstance(number.value, int | Decimal)
            return Literal(-number.value, token.at)
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE", "NULL"):
            self.take()
            return Literal({"TRUE": True, "FALSE": False, "NULL": None}[token.text], token.at)
        if token.kind == "name":
            self.take()
            if self.token.kind == "(":
                raise PredicateError(f"unexpected '(' after {token.text!r}: a predicate calls no functions",
                                     self.token.at)
            name = self.columns.get(token.text.lower())
            if name is None and token.text.upper() in _SQL_WORDS:
                raise PredicateError(f"unexpected {token.text!r}: a predicate has no subqueries, SELECT or UNION",
                                     token.at)
            if name is None:
                known = ", ".join(self.columns.values())
                raise PredicateError(f"unknown column {token.text!r} (the columns: {known})", token.at)
            return Column(name, token.at)
        raise self.unexpected("a column or a literal")


class _Nested:
    """Counts one level of nesting for a `with` block; refuses one too many."""

    def __init__(self, parser: _Parser, at: int) -> None:
        self.parser, self.at = parser, at

    def __enter__(self) -> None:
        self.parser.depth += 1
        if self.parser.depth > MAX_DEPTH:
            raise PredicateError(f"nested more than {MAX_DEPTH} deep", self.at)

    def __exit__(self, *exc: object) -> None:
        self.parser.depth -= 1


def parse_predicate(text: str, columns: Collection[str]) -> Predicate:
    """The predicate `text` says over a table of `columns` (matched in any case), or PredicateError
    naming what is wrong and the character where it is."""
    if len(text) > MAX_TEXT:
        raise PredicateError(f"longer than {MAX_TEXT} characters ({len(text)})")
    if not text.strip():
        raise PredicateError("empty: write a predicate, e.g. message_type = 'order'")
    parser = _Parser(text, columns)
    predicate = parser.predicate()
    if parser.token.kind != "end":
        raise parser.unexpected("AND, OR or the end" if parser.token.kind != ")" else None)
    return predicate

