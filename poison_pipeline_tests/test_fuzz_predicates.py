"""Random text as a `--where` predicate: the parser and the filter built from it either accept it or
refuse it with PredicateError (a SelectionError once the selection wraps it), never another error,
a recursion limit or a hang, whatever its length, nesting or characters."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from poison_pipeline.domain.predicates import PredicateError
from poison_pipeline.operations.where import where_filter
from poison_pipeline.storage import schemas
from poison_pipeline_tests.fuzz_support import COUNTS, fuzz_settings

# Tokens of the grammar and of SQL beyond it, so random sequences reach deep into the parser.
_PIECES = ["message_id", "abort_count", "due_at", "headers", "body", "nope", "AND", "OR", "NOT", "IS", "NULL",
           "IN", "LIKE", "BETWEEN", "TRUE", "FALSE", "(", ")", ",", "=", "!=", "<>", "<", "<=", ">", ">=", "-",
           "'x'", "'it''s'", "'", "''", "1", "2.5", ".5", "1e9", "99999999999999999999999", "'2026-01-01'",
           "SELECT", "UNION", "--", "/*", "*/", ";", "repeat(", "\x00", "\u00e9", "\U0001f600", " ", "\n"]


@fuzz_settings("predicates")
@given(text=st.one_of(st.text(max_size=80), st.lists(st.sampled_from(_PIECES), max_size=30).map(" ".join),
                      st.lists(st.sampled_from(_PIECES), max_size=30).map("".join)))
@example(text="(" * 5000)
@example(text="NOT " * 2000 + "TRUE")
@example(text="abort_count = 1 AND " * 180 + "TRUE")
def test_random_text_is_a_predicate_or_a_predicate_error_never_a_crash(text: str) -> None:
    COUNTS["predicates"] += 1
    try:
        where_filter(text, schemas.DEAD_LETTER)
    except PredicateError as error:
        COUNTS["predicates refused"] += 1
        assert str(error)
    else:
        COUNTS["predicates accepted"] += 1


_ATOMS = st.sampled_from(["message_id = 'a'", "abort_count > 1", "due_at <= '2026-01-01T00:00Z'", "reason IS NULL",
                          "message_type IN ('x', 'y''z')", "message_id NOT LIKE 'a%'", "abort_count BETWEEN 1 AND 2",
                          "dead_lettered_at IS NOT NULL", "TRUE", "1 = 1", "body LIKE '%x%'"])
_GRAMMATICAL = st.recursive(_ATOMS, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from([" AND ", " OR ", " and ", " or "]), inner).map("".join),
    inner.map(lambda p: f"NOT ({p})"), inner.map(lambda p: f"({p})")), max_leaves=12)


@fuzz_settings("predicates")
@given(text=_GRAMMATICAL)
def test_a_predicate_of_the_grammar_is_accepted_and_filters_rows(text: str) -> None:
    COUNTS["grammatical predicates"] += 1
    rows = schemas.DEAD_LETTER.empty_table()
    assert rows.filter(where_filter(text, schemas.DEAD_LETTER)).num_rows == 0
