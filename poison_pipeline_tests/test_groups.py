"""Failure groups: fast rules on tiny Arrow tables (no Spark, no Dagster), then a real cycle whose two
bugs make two groups, then the CLI's --json."""

from __future__ import annotations

import json
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from dagster import DagsterInstance, materialize
from deltalake import QueryBuilder
from pyspark.sql import SparkSession

from poison_pipeline.cli import main
from poison_pipeline.defs.assets import queue_assets
from poison_pipeline.defs.naming import asset_key
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.domain.errors import describe, frame_name, is_handler_code, normalise, signature_of
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import (
    FailureGroup,
    UnknownGroup,
    failure_groups,
    group_filter,
    group_id,
    group_rows,
    key_expression,
    locate_group,
    select_group,
    top_frame_of,
)
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import seed

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SIG_A = "0123456789abcdef"
SIG_B = "fedcba9876543210"


# -- normalisation -------------------------------------------------------------------------------


@pytest.mark.parametrize(("message", "normalised"), [
    ("order 1234 not found", "order <n> not found"),
    ("order ORD-1234 costs 12.50", "order ORD-<n> costs <n>"),
    ("no profile for user 3f2a9c10-1b2c-4d5e-8f90-a1b2c3d4e5f6", "no profile for user <id>"),
    ("KeyError for 'SKU-17' and \"SKU-99\"", "KeyError for <str> and <str>"),
    ("can't decode byte 0xff in position 7", "can't decode byte <id> in position <n>"),
    ("can't find 'part-7' in stock", "can't find <str> in stock"),
    ("ids ORD1234 and a1b2c3 differ", "ids <id> and <id> differ"),
    ("Expecting value: line 1 column 5 (char 4)", "Expecting value: line <n> column <n> (char <n>)"),
])
def test_normalise_blanks_numbers_ids_and_quoted_values(message: str, normalised: str) -> None:
    assert normalise(message) == normalised


def test_messages_differing_only_in_their_values_normalise_alike() -> None:
    assert normalise("Expecting value: line 1 column 1 (char 0)") == \
        normalise("Expecting value: line 3 column 17 (char 40)")
    assert normalise("no stock for 'SKU-1' in 'WH-2'") == normalise("no stock for 'X' in 'Y'")


def test_a_missing_key_names_its_group_and_its_variable_parts_are_blanked() -> None:
    """Two missing fields are two bugs; one missing SKU or another is one."""
    sku, price = (describe(_caught(_raise, KeyError(k))) for k in ("sku", "price"))
    assert sku.signature != price.signature
    assert normalise(sku.message, sku.type) == "'sku'"
    first, second = (describe(_caught(_raise, KeyError(k))) for k in ("SKU-17", "SKU-99"))
    assert first.signature == second.signature
    assert normalise(first.message, first.type) == "'SKU-<n>'"


# -- the top frame: the handler's own code --------------------------------------------------------


def _parse(text: str) -> object:
    return json.loads(text)  # fails inside json.decoder (the standard library)


def _handler(text: str) -> object:
    return _parse(text)


def _caught(call: Any, *args: Any) -> BaseException:
    try:
        call(*args)
    except Exception as error:  # noqa: BLE001
        return error
    raise AssertionError("expected an error")


def test_top_frame_is_the_handlers_own_innermost_frame_not_the_library() -> None:
    error = _caught(_handler, "{bad")
    info = describe(error)
    assert "decoder.py" in info.stack  # the error surfaced in the json module ...
    top = "test_groups.py:_parse"      # ... but the signature names the handler's frame
    assert info.signature == signature_of("json.decoder.JSONDecodeError", normalise(str(error)), top)
    assert top_frame_of(info.type, info.message, info.stack, info.signature) == top


def test_the_same_bug_with_other_values_has_the_same_signature() -> None:
    one = describe(_caught(_handler, "{bad"))
    other = describe(_caught(_handler, "{   also bad"))
    assert one.message != other.message and one.signature == other.signature
    assert describe(_caught(_handler, "[1,")).signature != one.signature  # another message


def test_frames_of_poison_pipelines_engine_are_not_the_handlers() -> None:
    # normalise(None) fails in the re module, called from poison_pipeline.domain.errors.
    error = _caught(normalise, None)
    info = describe(error)
    assert top_frame_of(info.type, info.message, info.stack, info.signature) == \
        "test_groups.py:_caught"


def test_without_any_handler_frame_the_innermost_frame_is_used() -> None:
    caught: list[BaseException] = []
    code = compile("import json\ntry:\n    json.loads('{')\nexcept ValueError as e:\n    caught.append(e)\n",
                   "<string>", "exec")
    exec(code, {"caught": caught})  # noqa: S102 - a frame that is no file of the handler's
    info = describe(caught[0])
    assert top_frame_of(info.type, info.message, info.stack, info.signature) == "decoder.py:raw_decode"


class _Coded(Exception):
    code = 42


class _Empty(Exception):
    pass


def _raise(error: BaseException) -> None:
    raise error


def _noted() -> BaseException:
    error = _caught(_raise, KeyError("sku"))
    error.add_note("while reserving stock")
    return error


def _syntax() -> BaseException:
    return _caught(compile, "def (:", "<handler>", "exec")


def _chained_error() -> BaseException:
    try:
        _raise(ValueError("quantity 'x'"))
    except ValueError as cause:
        try:
            raise RuntimeError("withdrawal failed") from cause
        except RuntimeError as error:
            return error
    raise AssertionError("expected an error")


@pytest.mark.parametrize("make", [
    lambda: _caught(_handler, "{bad"),
    lambda: _caught(_raise, _Coded("order 17 refused")),
    lambda: _caught(_raise, _Empty()),
    lambda: _caught(_raise, KeyError("")),
    _noted,
    _syntax,
    _chained_error,
], ids=["library", "own-module", "empty-message", "builtin-empty-text", "notes", "syntax", "chained"])
def test_the_stored_stack_is_pythons_traceback_on_every_attempt(make: Any) -> None:
    """The stack is what the traceback module prints, whether described afresh or again (a poison
    message fails the same way on each attempt, and its later attempts reuse the first's work)."""
    first, again = make(), make()
    expected = "".join(traceback.format_exception(first))
    for error in (first, again, first):
        info = describe(error)
        assert info.stack == expected[-8000:]
        assert info.message == str(error) and info.code == (None if not hasattr(error, "code") else "42")


@pytest.mark.parametrize(("module", "filename", "own", "handler_code"), [
    ("myapp.handlers", "/srv/app/myapp/handlers.py", None, True),
    ("poison_pipeline.engine.delivery", "/srv/app/poison_pipeline/engine/delivery.py", None, False),
    ("poison_pipeline.domain.envelope", "/x/poison_pipeline/domain/envelope.py", None, False),
    ("poison_pipeline.examples.handlers", "/x/poison_pipeline/examples/handlers.py", None, True),
    ("psycopg.cursor", "/venv/lib/python3.11/site-packages/psycopg/cursor.py", None, False),
    ("myapp.db", "/venv/lib/python3.11/site-packages/myapp/db.py", None, False),
    ("myapp.db", "/venv/lib/python3.11/site-packages/myapp/db.py", "myapp", True),
    ("requests.api", "/usr/lib/python3/dist-packages/requests/api.py", "myapp", False),
    ("json.decoder", json.decoder.__file__, None, False),
    ("importlib._bootstrap", "<frozen importlib._bootstrap>", None, False),
])
def test_whose_code_a_frame_is(module: str, filename: str, own: str | None, handler_code: bool) -> None:
    assert is_handler_code(module, filename, own) is handler_code


def test_frame_name_has_no_line_number() -> None:
    assert frame_name("/srv/app/myapp/handlers.py", "withdraw") == "handlers.py:withdraw"


# -- group ids --------------------------------------------------------------------------------------


def test_group_ids_are_short_and_stable() -> None:
    assert group_id(SIG_A) == "01234567"  # a signature's first 8 hex digits, as inspect shows it
    # Without an error the key is the reason; these literals hold on every machine and run.
    assert group_id("no-error:expired") == "ce2e38dd"
    assert group_id("worker-died") == "f2d64e06"
    assert len({group_id(k) for k in ("no-error:expired", "no-error:rejected", "no-error:(none)")}) == 3


# -- grouping tiny tables ---------------------------------------------------------------------------


def _rows(table: str, *rows: dict[str, Any]) -> pa.Table:
    """Rows of `table` with only the given columns set (the others null), as the table stores them."""
    schema = schemas.DEAD_LETTER if table == "dead_letter" else schemas.MESSAGE
    return pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows], schema=schema)


def _failure(message_id: str, minutes: int, signature: str | None, message_type: str = "order",
             reason: str | None = "rejected", **extra: Any) -> dict[str, Any]:
    at = T0 + timedelta(minutes=minutes)
    return {"message_id": message_id, "message_type": message_type, "last_error_signature": signature,
            "last_error_type": None if signature is None else "KeyError",
            "last_error_message": None if signature is None else f"'SKU-{minutes}'",
            "reason": reason, "entered_at": at, "dead_lettered_at": at, **extra}


def test_rows_group_by_signature_with_counts_times_types_and_latest_examples() -> None:
    rows = _rows("dead_letter",
                 _failure("a1", 1, SIG_A), _failure("a2", 5, SIG_A, "refund"), _failure("a3", 3, SIG_A),
                 _failure("a4", 4, SIG_A), _failure("b1", 2, SIG_B),
                 _failure("x1", 7, None, reason="expired"), _failure("x2", 6, None, reason="expired"),
                 _failure("c1", 9, None, reason="conversation_ended"))

    groups = group_rows(rows, "q", "dead_letter")

    assert [(g.id, g.count) for g in groups] == [("01234567", 4), ("ce2e38dd", 2), ("78f563bd", 1), ("fedcba98", 1)]
    a = groups[0]
    assert (a.queue, a.table, a.signature, a.error_type, a.error_message) == \
        ("q", "dead_letter", SIG_A, "KeyError", "'SKU-<n>'")
    assert (a.first_failure_at, a.last_failure_at) == (T0 + timedelta(minutes=1), T0 + timedelta(minutes=5))
    assert a.message_types == {"order": 3, "refund": 1}
    assert a.reasons == {"rejected": 4}
    assert a.example_ids == ("a2", "a4", "a3")  # the latest three
    assert a.example_error_message == "'SKU-5'"
    expired = groups[1]
    assert (expired.signature, expired.error_type, expired.top_frame, expired.reasons) == \
        (None, None, None, {"expired": 2})
    assert expired.example_ids == ("x1", "x2")
    assert groups[2].reasons == {"conversation_ended": 1}  # ties: the most recent first


def test_poison_rows_group_without_a_reason_column() -> None:
    rows = _rows("poison", _failure("a1", 1, SIG_A), _failure("a2", 2, SIG_A), _failure("n1", 3, None))
    rows = rows.drop_columns([c for c in ("reason", "dead_lettered_at") if c in rows.column_names])
    groups = group_rows(rows, "q", "poison")
    assert [(g.id, g.count, g.reasons) for g in groups] == [("01234567", 2, {}), (group_id("no-error:(none)"), 1, {})]


def test_the_top_frame_is_recovered_from_the_stored_stack() -> None:
    info = describe(_caught(_handler, "{bad"))
    row = _failure("m1", 1, info.signature, last_error_type=info.type, last_error_message=info.message,
                   last_error_stack=info.stack)
    [group] = group_rows(_rows("dead_letter", row), "q", "dead_letter")
    assert (group.error_type, group.top_frame) == ("json.decoder.JSONDecodeError", "test_groups.py:_parse")
    assert group.error_message == "Expecting property name enclosed in double quotes: line <n> column <n> (char <n>)"


def test_a_signature_from_other_rules_keeps_its_group_but_no_top_frame() -> None:
    row = _failure("m1", 1, SIG_A, last_error_stack='  File "/srv/h.py", line 3, in handle\n')
    [group] = group_rows(_rows("dead_letter", row), "q", "dead_letter")
    assert (group.id, group.top_frame) == ("01234567", None)


def test_key_expressions_select_a_groups_rows() -> None:
    rows = _rows("dead_letter", _failure("a1", 1, SIG_A), _failure("b1", 2, SIG_B),
                 _failure("x1", 3, None, reason="expired"), _failure("y1", 4, None, reason=None))
    selected = {key: rows.filter(key_expression(key, "dead_letter")).column("message_id").to_pylist()
                for key in (SIG_A, "no-error:expired", "no-error:(none)")}
    assert selected == {SIG_A: ["a1"], "no-error:expired": ["x1"], "no-error:(none)": ["y1"]}


def test_the_dead_letter_asset_carries_its_failure_groups(make_declaration) -> None:
    declaration = make_declaration({"q": MOVE_AT_ONCE})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    seed(tables, "dead_letter", _rows("dead_letter", _failure("a1", 1, SIG_A), _failure("a2", 2, SIG_A),
                                      _failure("x1", 3, None, reason="expired")))
    [dead_letter] = [a for a in queue_assets(declaration, "q") if a.key == asset_key("q", "dead_letter")]
    with DagsterInstance.ephemeral() as instance:
        result = materialize([dead_letter], instance=instance)
    [event] = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()}
    assert (metadata["failure_groups"], metadata["failed_messages"], metadata["largest_failure_group"]) == (2, 3, 2)
    top = metadata["failure_groups_top"]
    assert "| 01234567@1 | 2 |" in top and "KeyError: 'SKU-&lt;n&gt;'" in top
    assert "| a2, a1 | order 2 |" in top  # the latest example ids and the message types


# -- a real cycle: two bugs, two groups -------------------------------------------------------------

MOVE_AT_ONCE = {
    "handler": "poison_pipeline_tests.handlers:two_bugs",
    "policy": {"receive_retry_count": 1, "max_retry_cycles": 0, "retry_cycle_delay": 0,
               "receive_error_handling": "move"},
}
PARSE_BUG = ("json.decoder.JSONDecodeError", "handlers.py:_parse_payload")
PRICE_BUG = ("KeyError", "handlers.py:_price")


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Queue q after its inbound cycle: three malformed payloads and two unknown SKUs in poison, one
    expired message in dead_letter, one processed. Returns the declaration file."""
    folder = tmp_path_factory.mktemp("groups")
    config = folder / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": MOVE_AT_ONCE}}))
    declaration = load_declaration(str(config))
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    result = enqueue(declaration, "q", [
        {"message_id": "p-1", "message_type": "order", "body": {"payload": "{oops"}},
        {"message_id": "p-2", "message_type": "order", "body": {"payload": "{  nope"}},
        {"message_id": "p-3", "message_type": "refund", "body": {"payload": "{x"}},
        {"message_id": "s-1", "message_type": "order", "body": {"sku": "SKU-17"}},
        {"message_id": "s-2", "message_type": "order", "body": {"sku": "SKU-99"}},
        {"message_id": "ok-1", "message_type": "order", "body": {"sku": "SKU-1"}},
        {"message_id": "old-1", "message_type": "order", "body": {}, "expires_at": past},
    ])
    assert result.accepted == 7, result.refused
    report = run_cycle(spark, declaration, "q", "inbound")
    assert (report.counts["poisoned"], report.counts["processed"], report.counts["expired"]) == (5, 1, 1), \
        report.counts
    return config


def _by_error(groups: list[FailureGroup]) -> dict[tuple[str | None, str | None], FailureGroup]:
    return {(g.error_type, g.top_frame): g for g in groups}


def test_two_bugs_make_two_groups_named_by_the_handlers_frames(lake: Path) -> None:
    declaration = load_declaration(str(lake))
    groups = failure_groups(declaration, "q", "poison")
    assert [g.count for g in groups] == [3, 2]
    found = _by_error(groups)
    parse, price = found[PARSE_BUG], found[PRICE_BUG]
    assert parse.error_message == "Expecting property name enclosed in double quotes: line <n> column <n> (char <n>)"
    assert price.error_message == "'SKU-<n>'"  # the missing key, its number blanked
    assert sorted(parse.example_ids) == ["p-1", "p-2", "p-3"] and sorted(price.example_ids) == ["s-1", "s-2"]
    assert parse.message_types == {"order": 2, "refund": 1} and price.message_types == {"order": 2}
    assert parse.first_failure_at is not None and parse.first_failure_at <= parse.last_failure_at
    assert parse.id == parse.signature[:8] and parse.id != price.id
    # Every table of every queue: the expired message groups by its reason.
    everything = failure_groups(declaration)
    assert [(g.table, g.count) for g in everything] == [("poison", 3), ("poison", 2), ("dead_letter", 1)]
    assert (everything[2].id, everything[2].reasons, everything[2].example_ids) == \
        (group_id("no-error:expired"), {"expired": 1}, ("old-1",))


def test_a_group_id_selects_its_rows_for_redrive_and_purge(lake: Path) -> None:
    declaration = load_declaration(str(lake))
    price = _by_error(failure_groups(declaration, "q", "poison"))[PRICE_BUG]
    poison = QueueTables.of(declaration, "q").open("poison")

    expression = group_filter(declaration, price.id, "q", "poison")
    assert sorted(poison.to_pyarrow_dataset().to_table(filter=expression).column("message_id").to_pylist()) == \
        ["s-1", "s-2"]
    selection = select_group(declaration, price.id.upper(), "q", "poison")  # ids are case-insensitive
    assert (selection.group_id, selection.rows, selection.keys) == (price.id, 2, (price.signature,))
    # The SQL predicate selects the same rows through delta-rs.
    found = QueryBuilder().register("poison", poison).execute(
        f"SELECT message_id FROM poison WHERE {selection.predicate} ORDER BY message_id").read_all()
    assert found.column("message_id").to_pylist() == ["s-1", "s-2"]
    assert [(s.queue, s.table, s.rows) for s in locate_group(declaration, price.id)] == [("q", "poison", 2)]


def test_an_unknown_group_is_named(lake: Path) -> None:
    declaration = load_declaration(str(lake))
    with pytest.raises(UnknownGroup, match="'00000000'.*no row of poison, dead_letter, quarantine"):
        locate_group(declaration, "00000000")
    with pytest.raises(UnknownGroup, match="'nope'.*not a group id"):
        group_filter(declaration, "nope", "q", "poison")
    expired = group_id("no-error:expired")
    with pytest.raises(UnknownGroup, match=f"'{expired}': no row of poison in queue 'q'.*rows in q/dead_letter"):
        select_group(declaration, expired, "q", "poison")


def test_the_same_failure_keeps_its_id_in_quarantine(spark: SparkSession, lake: Path) -> None:
    declaration = load_declaration(str(lake))
    before = {g.id: g.count for g in failure_groups(declaration, "q", "poison")}
    run_cycle(spark, declaration, "q", "poison")  # the default poison reader: into quarantine
    assert failure_groups(declaration, "q", "poison") == []
    after = failure_groups(declaration, "q", "quarantine")
    assert {g.id: g.count for g in after} == before
    assert {(g.error_type, g.top_frame) for g in after} == {PARSE_BUG, PRICE_BUG}


# -- the command line -------------------------------------------------------------------------------

GROUP_KEYS = ["id", "queue", "table", "signature", "error_type", "error_message", "top_frame", "count",
              "first_failure_at", "last_failure_at", "message_types", "reasons", "example_ids",
              "example_error_message", "version", "note"]


def test_groups_json_is_stable(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(lake), "groups", "--json", "--table", "dead_letter"]) == 0
    output = json.loads(capsys.readouterr().out)
    assert list(output) == ["checked_at", "since", "until", "groups"]
    assert (output["since"], output["until"]) == (None, None)
    [group] = output["groups"]
    assert list(group) == GROUP_KEYS
    assert {k: group[k] for k in ("id", "queue", "table", "signature", "error_type", "count", "reasons",
                                  "example_ids")} == {
        "id": group_id("no-error:expired"), "queue": "q", "table": "dead_letter", "signature": None,
        "error_type": None, "count": 1, "reasons": {"expired": 1}, "example_ids": ["old-1"]}
    assert datetime.fromisoformat(group["first_failure_at"]).tzinfo is not None


def test_groups_table_for_people(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    declaration = load_declaration(str(lake))
    ids = [g.id for g in failure_groups(declaration)]
    assert main(["--config", str(lake), "groups", "--queue", "q"]) == 0
    out = capsys.readouterr().out
    assert all(i in out for i in ids) and "failure group(s)" in out and "no error: expired" in out


def test_groups_usage_errors(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(lake), "groups", "--queue", "nope"]) == 2
    assert "no queue 'nope' is declared" in capsys.readouterr().err
    assert main(["--config", str(lake), "groups", "--table", "inbound"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_groups_since_and_until_count_only_the_failures_of_their_window(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": MOVE_AT_ONCE}}))
    declaration = load_declaration(str(config))
    enqueue(declaration, "q", [{"message_id": f"early-{n}", "message_type": "order", "body": {"sku": f"SKU-{n + 17}"}}
                               for n in range(3)])
    run_cycle(spark, declaration, "q", "inbound")
    between = datetime.now(UTC)
    enqueue(declaration, "q", [{"message_id": "late-1", "message_type": "order", "body": {"sku": "SKU-9"}},
                               {"message_id": "late-2", "message_type": "refund", "body": {"payload": "{x"}}])
    run_cycle(spark, declaration, "q", "inbound")

    def counts(*window: str) -> dict[tuple[str | None, str | None], int]:
        assert main(["--config", str(config), "groups", "--json", *window]) == 0
        groups = json.loads(capsys.readouterr().out)["groups"]
        return {(g["error_type"], g["top_frame"]): g["count"] for g in groups}

    assert counts() == {PRICE_BUG: 4, PARSE_BUG: 1}
    assert counts("--since", "1h") == {PRICE_BUG: 4, PARSE_BUG: 1}
    # The price bug failed before and after `between`: each side counts its own messages.
    assert counts("--since", between.isoformat()) == {PRICE_BUG: 1, PARSE_BUG: 1}
    assert counts("--until", between.isoformat()) == {PRICE_BUG: 3}
    assert counts("--since", "1h", "--until", "30m") == {}
    assert main(["--config", str(config), "groups", "--until", between.isoformat()]) == 0
    out = capsys.readouterr().out
    assert "1 failure group(s), 3 failed message(s)" in out and "early-" in out and "late-" not in out


def test_groups_refuses_a_window_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": MOVE_AT_ONCE}}))
    assert main(["--config", str(config), "groups", "--since", "yesterday"]) == 2
    assert "'yesterday' is neither an age (90, 30m, 1h, 7d) nor an ISO 8601 time" in capsys.readouterr().err
    assert main(["--config", str(config), "groups", "--since", "30m", "--until", "1h"]) == 2
    assert "is not before until" in capsys.readouterr().err
    assert main(["--config", str(config), "groups", "--since", "9999999d"]) == 2
    assert "longer than" in capsys.readouterr().err
    assert main(["--config", str(config), "groups", "--since", "1h"]) == 0
    assert "hold no message that failed since" in capsys.readouterr().out


def test_groups_of_a_queue_without_failures_is_a_success(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": MOVE_AT_ONCE}}))
    assert main(["--config", str(config), "groups"]) == 0
    assert "no failures" in capsys.readouterr().out
    assert main(["--config", str(config), "groups", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"] == []
