"""`--where`: a predicate over the table's columns, parsed and evaluated by pyarrow, never SQL text.
Hostile input (UNION, comments, table functions, huge strings, subqueries, `;`) is refused with
exit code 2 and no table changed; the grammar's predicates select the rows they say."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline import cli
from poison_pipeline.domain.predicates import MAX_DEPTH, MAX_TEXT, parse_predicate
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection, SelectionError, check_where
from poison_pipeline.operations.where import where_filter
from poison_pipeline.storage import schemas
from poison_pipeline_tests.support import rows, table_versions
from poison_pipeline_tests.test_redrive import lake  # noqa: F401 - the fixture: q with 4 messages in poison

HOSTILE = [
    ("1=0) UNION ALL SELECT message_id, batch_id FROM t --", "unexpected ')' at character 4"),
    ("message_id = 'x' OR 1=1 -- AND message_type = 'y'", "comments ('--') are not part of a predicate"),
    ("NOT EXISTS (SELECT 1 FROM generate_series(1, 12000000000) WHERE value < 0)",
     "unexpected '(' after 'EXISTS': a predicate calls no functions"),
    ("message_id IN (SELECT value FROM generate_series(1, 100000000000))",
     "unexpected 'SELECT': a predicate has no subqueries"),
    ("message_id = repeat('x', 800000000)", "unexpected '(' after 'repeat'"),
    ("message_id = (SELECT max(message_id) FROM t)", "unexpected '(' (expected a column or a literal) at character 14"),
    ("message_id = 'x'; DELETE FROM t", "one predicate only: unexpected ';' at character 17"),
    ("message_id = 'x' /* hidden */", "comments ('/*') are not part of a predicate"),
    ("no_such_column = 1", "unknown column 'no_such_column' (the columns: message_id, "),
    ("(" * (MAX_DEPTH + 1) + "TRUE" + ")" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} deep"),
    ("message_id = '" + "x" * MAX_TEXT + "'", f"longer than {MAX_TEXT} characters"),
]


def _config(declaration: Any, tmp_path: Path) -> str:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(json.loads(declaration.model_dump_json())))
    return str(config)


@pytest.mark.parametrize(("where", "says"), HOSTILE)
def test_hostile_predicates_are_refused_by_redrive_and_purge_with_exit_2_and_nothing_changed(
        lake, tmp_path, capsys, where, says):  # noqa: F811
    declaration, _ = lake
    config = _config(declaration, tmp_path)
    before = table_versions(declaration)
    for command in (["redrive", "q", "--from", "poison"], ["purge", "q", "--table", "poison", "--older-than", "0",
                                                           "--yes"]):
        assert cli.main(["--config", config, *command, "--where", where]) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert says in err and "is not a predicate over the columns of poison" in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert table_versions(declaration) == before
    assert not (Path(declaration.lake_root) / "q" / "_work").exists() or not any(
        (Path(declaration.lake_root) / "q" / "_work").rglob("plan.parquet"))


def test_the_command_in_its_own_process_refuses_a_huge_repeat_at_once(lake, tmp_path):  # noqa: F811
    declaration, _ = lake
    before = table_versions(declaration)
    done = subprocess.run([sys.executable, "-m", "poison_pipeline.cli", "--config", _config(declaration, tmp_path),
                           "redrive", "q", "--from", "poison", "--where", "message_id = repeat('x', 800000000)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == cli.EXIT_USAGE, done.stderr
    assert "a predicate calls no functions" in done.stderr and "Traceback" not in done.stderr
    assert table_versions(declaration) == before


Row = dict[str, Any]
LEGITIMATE: list[tuple[str, Callable[[Row], bool]]] = [
    ("message_type = 'withdrawal' AND NOT message_id = 'db-1'",
     lambda r: r["message_type"] == "withdrawal" and r["message_id"] != "db-1"),
    ("message_id IN ('db-0', 'nope') OR message_type = 'refund'",
     lambda r: r["message_id"] == "db-0" or r["message_type"] == "refund"),
    ("message_id NOT IN ('db-0', 'db-2')", lambda r: r["message_id"] not in ("db-0", "db-2")),
    ("message_id LIKE 'db-%' AND message_id <> 'db-2'", lambda r: r["message_id"] in ("db-0", "db-1")),
    ("message_id NOT LIKE 'db-_'", lambda r: not r["message_id"].startswith("db-")),
    ("conversation_id IS NULL AND last_error_type IS NOT NULL", lambda r: r["conversation_id"] is None),
    ("entered_at > '2000-01-01' AND entered_at < '2999-12-31T23:59:59+00:00'", lambda r: True),
    ("due_at >= '2999-01-01T00:00Z'", lambda r: False),
    ("total_abort_count BETWEEN 1 AND 2 AND redrive_count NOT BETWEEN 1 AND 9",
     lambda r: 1 <= r["total_abort_count"] <= 2 and not 1 <= (r["redrive_count"] or 0) <= 9),
    ("(message_type = 'refund' OR message_id = 'db-2') and TRUE", lambda r: r["message_id"] in ("own-1", "db-2")),
    ("body LIKE '%down_if%'", lambda r: b"down_if" in r["body"]),
]


@pytest.mark.parametrize(("where", "holds"), LEGITIMATE)
def test_a_predicate_selects_the_rows_it_says(lake, where, holds):  # noqa: F811
    declaration, _ = lake
    expected = sorted(r["message_id"] for r in rows(declaration, "poison") if holds(r))
    result = redrive_table(declaration, "q", "poison", Selection(where=where), dry_run=True)
    assert sorted(result.sample_ids) == expected and result.moved == len(expected)


def test_a_redrive_through_the_command_line_moves_what_the_predicate_selects(lake, tmp_path, capsys):  # noqa: F811
    declaration, _ = lake
    config = _config(declaration, tmp_path)
    assert cli.main(["--config", config, "redrive", "q", "--from", "poison", "--json",
                     "--where", "message_id IN ('db-0', 'own-1') AND entered_at < '2999-01-01'"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["moved"] == 2
    assert sorted(r["message_id"] for r in rows(declaration, "poison")) == ["db-1", "db-2"]


def test_check_where_reads_no_rows_and_names_the_problem():
    check_where("dead_letter", "reason = 'expired' AND dead_lettered_at < '2026-01-01'")
    with pytest.raises(SelectionError, match="unknown column 'dead_lettered_at'"):
        check_where("quarantine", "dead_lettered_at < '2026-01-01'")
    with pytest.raises(SelectionError, match="column 'abort_count' holds numbers: 'x' cannot be compared"):
        check_where("poison", "abort_count = 'x'")
    with pytest.raises(SelectionError, match="'tomorrow' is not an ISO 8601 time"):
        check_where("poison", "due_at < 'tomorrow'")
    with pytest.raises(SelectionError, match="= NULL is never true: write IS NULL"):
        check_where("poison", "conversation_id = NULL")
    with pytest.raises(SelectionError, match="can only be tested with IS"):
        check_where("poison", "headers = 'x'")


def test_literals_follow_sql():
    tree = parse_predicate("message_id = 'it''s' AND abort_count >= -2.5 OR due_at IS NOT NULL",
                           schemas.MESSAGE.names)
    assert "it's" in repr(tree) and "Decimal('-2.5')" in repr(tree)
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    table = schemas.MESSAGE.empty_table()
    assert table.filter(where_filter(f"due_at = '{moment.isoformat()}'", schemas.MESSAGE)).num_rows == 0
