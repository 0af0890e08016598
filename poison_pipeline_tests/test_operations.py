"""Operator views on real Delta tables: status from the log, inspect that changes nothing."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from poison_pipeline.domain.declaration import Declaration, parse_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.inspect_message import inspect_message, render_body
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.status import queue_status
from poison_pipeline.storage import schemas
from poison_pipeline.storage.control import set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.text.status import format_age, format_status
from poison_pipeline_tests.support import seed, table_versions

HANDLER = "poison_pipeline_tests.handlers:scripted"
# Two cycles (inbound, then retry_1 with no delay) so a failing message has history in two tables.
REJECT_AFTER_ONE_RETRY_CYCLE = {
    "handler": HANDLER,
    "policy": {"receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0,
               "receive_error_handling": "reject"},
}
BINARY = b"\xde\xad\xbe\xef\x00\x01"


@pytest.fixture(scope="module")
def cycled(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Declaration:
    """Queue q after its inbound and retry_1 cycles: 2 processed, 2 rejected to dead-letter."""
    lake = tmp_path_factory.mktemp("ops") / "lake"
    declaration = parse_declaration({"lake_root": str(lake), "queues": {"q": REJECT_AFTER_ONE_RETRY_CYCLE}})
    result = enqueue(declaration, "q", [
        {"message_id": "ok-1", "message_type": "t", "body": {"n": 1}},
        {"message_id": "ok-2", "message_type": "t", "body": {"n": 2}},
        {"message_id": "bad-1", "message_type": "t", "body": {"fail": True}, "sender": "shop"},
        {"message_id": "bin-1", "message_type": "t", "encoding": "binary",
         "body_base64": base64.b64encode(BINARY).decode()},
    ])
    assert result.accepted == 4, result.refused
    assert run_cycle(spark, declaration, "q", "inbound").counts["moved"] == 2
    assert run_cycle(spark, declaration, "q", "retry_1").counts["rejected"] == 2
    return declaration


def lake_files(declaration: Declaration) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in Path(declaration.lake_root).rglob("*")}


def test_status_after_cycles_counts_every_table(cycled: Declaration) -> None:
    now = datetime.now(UTC)
    status = queue_status(cycled, "q", now)

    assert [t.table for t in status.tables] == [
        "inbound", "retry_1", "poison", "dead_letter", "quarantine", "processed", "attempts"]
    assert status.enabled and status.reason is None
    assert {t.table: t.rows for t in status.tables} == {
        "inbound": 0, "retry_1": 0, "poison": 0, "dead_letter": 2, "quarantine": 0,
        # ok-1 and ok-2 once each; bad-1 and bin-1 twice per cycle in two cycles.
        "processed": 2, "attempts": 2 + 4 + 4,
    }
    assert status.table("dead_letter").by == {"rejected": 2}
    assert status.table("processed").by == {"processed": 2}
    assert status.table("inbound").due == 0
    assert status.table("dead_letter").due is None
    age = status.table("dead_letter").oldest_age_s
    assert age is not None and 0 <= age < 600
    text = format_status([status])
    assert text.startswith("q: ENABLED")
    assert "rejected=2" in text


def test_status_counts_due_and_next_due_from_the_log(make_declaration) -> None:
    declaration = make_declaration({"q": {"handler": HANDLER}})
    start = datetime(2030, 1, 1, tzinfo=UTC)
    enqueue(declaration, "q", [{"message_id": f"m{i}", "message_type": "t", "body": {}} for i in range(3)],
            now=start)
    enqueue(declaration, "q", [{"message_id": "later", "message_type": "t", "body": {}}],
            now=start + timedelta(hours=1))

    status = queue_status(declaration, "q", start + timedelta(minutes=5))

    inbound = status.table("inbound")
    assert (inbound.rows, inbound.due) == (4, 3)
    assert inbound.next_due == start + timedelta(hours=1)
    assert inbound.oldest_age_s == pytest.approx(300, abs=0.01)


def test_status_of_a_queue_with_no_tables_yet(make_declaration) -> None:
    declaration = make_declaration({"q": {"handler": HANDLER}})
    status = queue_status(declaration, "q", datetime.now(UTC))
    assert status.enabled
    assert not any(t.exists for t in status.tables)
    assert not Path(declaration.lake_root).exists(), "status must not create tables"
    assert "(not created yet)" in format_status([status])


def test_status_says_disabled_with_reason_actor_and_since(make_declaration) -> None:
    declaration = make_declaration({"q": {"handler": HANDLER}})
    set_enabled(QueueTables.of(declaration, "q"), False, "ops-team", "database outage")

    status = queue_status(declaration, "q", datetime.now(UTC))

    assert (status.enabled, status.actor, status.reason) == (False, "ops-team", "database outage")
    assert status.since is not None
    assert "q: DISABLED since" in format_status([status])
    assert "ops-team: database outage" in format_status([status])


def test_status_counts_dispositions_of_files_that_mix_them(make_declaration) -> None:
    declaration = make_declaration({"q": {"handler": HANDLER}})
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    at = datetime(2030, 1, 1, tzinfo=UTC)

    def ledger(*dispositions: str) -> pa.Table:
        rows = [{"message_id": f"{d}-{i}", "disposition": d, "from_table": "inbound", "at": at,
                 "date": "2030-01-01", "cycle_seq": 1} for i, d in enumerate(dispositions)]
        return pa.Table.from_pylist(rows, schema=schemas.PROCESSED)

    seed(tables, "processed", ledger("processed", "processed", "processed"))  # one value: the log says
    seed(tables, "processed", ledger("processed", "duplicate", "dropped", "duplicate"))  # mixed: read

    status = queue_status(declaration, "q", at)

    assert status.table("processed").by == {"dropped": 1, "duplicate": 2, "processed": 4}
    assert status.table("processed").rows == 7


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0, "0s"), (59.9, "59s"), (60, "1m"), (61, "1m 1s"), (3600 * 5 + 120, "5h 2m"),
    (86400 * 2 + 3600, "2d 1h"),
])
def test_format_age(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


def test_inspect_shows_place_counts_body_and_attempt_history(cycled: Declaration) -> None:
    found = inspect_message(cycled, "bad-1")

    assert found is not None
    [place] = found.locations
    assert (place.queue, place.table, place.reason, place.from_table) == ("q", "dead_letter", "rejected",
                                                                          "retry_1")
    # Moved to retry_1 and back for its retry cycle before it was rejected: two moves.
    assert (place.abort_count, place.total_abort_count, place.move_count) == (2, 4, 2)
    assert place.last_error is not None and place.last_error.type == "ValueError"
    assert found.envelope.body.shown_as == "json"
    assert found.envelope.body.text == '{\n  "fail": true\n}'
    assert found.envelope.sender == "shop"
    history = [(a.table, a.cycle, a.attempt, a.outcome) for a in found.attempts]
    assert history == [("inbound", 0, 1, "abort"), ("inbound", 0, 2, "abort"),
                       ("retry_1", 1, 1, "abort"), ("retry_1", 1, 2, "abort")]
    started = [a.started_at for a in found.attempts]
    assert started == sorted(started)
    assert all(a.error and a.error.type == "ValueError" and a.error.signature for a in found.attempts)
    assert len({a.error.signature for a in found.attempts if a.error}) == 1


def test_inspect_changes_no_table_and_no_file(cycled: Declaration) -> None:
    versions, files = table_versions(cycled), lake_files(cycled)
    for message_id in ("bad-1", "ok-1", "bin-1", "missing"):
        inspect_message(cycled, message_id)
    assert table_versions(cycled) == versions
    assert lake_files(cycled) == files


def test_inspect_binary_body_is_hex(cycled: Declaration) -> None:
    found = inspect_message(cycled, "bin-1")
    assert found is not None
    assert found.envelope.body.shown_as == "hex"
    assert found.envelope.body.text.startswith("00000000  de ad be ef 00 01")
    assert found.envelope.raw_body == BINARY


def test_inspect_processed_message_has_no_body(cycled: Declaration) -> None:
    found = inspect_message(cycled, "ok-1")
    assert found is not None
    [place] = found.locations
    assert (place.table, place.disposition) == ("processed", "processed")
    assert found.envelope.body.shown_as == "absent"
    assert [(a.attempt, a.outcome) for a in found.attempts] == [(1, "success")]


def test_inspect_unknown_message_is_none(cycled: Declaration) -> None:
    assert inspect_message(cycled, "no-such-id") is None


def test_inspect_waiting_message_shows_due_time(make_declaration) -> None:
    declaration = make_declaration({"q": {"handler": HANDLER}})
    at = datetime(2030, 1, 1, tzinfo=UTC)
    enqueue(declaration, "q", [{"message_id": "w", "message_type": "t", "encoding": "xml",
                                "body": "<a>1</a>"}], now=at)
    found = inspect_message(declaration, "w")
    assert found is not None
    [place] = found.locations
    assert (place.table, place.due_at, place.abort_count, place.move_count) == ("inbound", at, 0, 0)
    assert (found.envelope.body.shown_as, found.envelope.body.text) == ("xml", "<a>1</a>")
    assert found.attempts == ()


@pytest.mark.parametrize(("body", "encoding", "shown_as", "text", "note"), [
    (b'{"a":[1,2]}', "json", "json", '{\n  "a": [\n    1,\n    2\n  ]\n}', None),
    (b"hello\nworld", "text", "text", "hello\nworld", None),
    (b"<a/>", "xml", "xml", "<a/>", None),
    (b"", "empty", "empty", "(empty)", None),
    (b"not json", "json", "text", "not json", "not valid JSON"),
    (b'{"a":1,"a":2}', "json", "text", '{"a":1,"a":2}', "a key appears twice"),
    (b"\xff\xfe", "text", "hex", "00000000  ff fe", "not valid UTF-8 at byte 0; shown as hex"),
    (b"x", "empty", "hex", "00000000  78", "encoding 'empty' yet 1 bytes"),
    (b"\x1b[31mred", "text", "text", "\\x1b[31mred", None),
])
def test_render_body(body: bytes, encoding: str, shown_as: str, text: str, note: str | None) -> None:
    rendered = render_body(body, encoding)
    assert rendered.shown_as == shown_as
    assert rendered.text.startswith(text)
    assert (rendered.note is None) if note is None else (note in (rendered.note or ""))


def test_render_body_clips_large_bodies() -> None:
    rendered = render_body(bytes(1000), "binary", limit=64)
    assert rendered.text.count("\n") == 3  # four lines of sixteen bytes
    assert rendered.size == 1000
    assert rendered.note == "showing the first 64 of 1000 bytes"


def test_render_body_never_evaluates_a_pickle() -> None:
    pickled = b"\x80\x04\x95\x1c\x00cos\nsystem\n(S'touch /tmp/pwned'\ntR."
    rendered = render_body(pickled, "binary")
    assert rendered.shown_as == "hex"
    assert "|" in rendered.text
