"""A rewrite of several batches of a waiting table (ending a conversation) may leave them sharing a
file; the next cycle must still take each message once, and leave nothing behind that it took."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from poison_pipeline.broker.conversations import end_conversation
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.storage.tables import QueueTables, _whole_due_files
from poison_pipeline_tests.support import places, queue, rows, send

NOW = datetime(2030, 1, 1, tzinfo=UTC)
BATCHES = 6


def send_batches(declaration, prefix: str, failing: bool) -> None:
    """One enqueue per batch: a message of conversation x and two others in each."""
    body = {"fail": True} if failing else {}
    for b in range(BATCHES):
        records = [{"message_id": f"{prefix}{b}-{suffix}", "message_type": "test", "body": body,
                    "conversation_id": "x" if suffix == "x" else None} for suffix in "xab"]
        assert not enqueue(declaration, "q", records).refused


def assert_each_message_once(declaration, expected: int) -> None:
    found = places(declaration)
    assert len(found) == expected
    twice = {mid: where for mid, where in found.items() if len(where) != 1}
    assert not twice, twice
    attempts = Counter((r["message_id"], r["cycle"]) for r in rows(declaration, "attempts"))
    assert max(attempts.values()) == 1, attempts.most_common(3)


def test_a_cycle_after_ending_a_conversation_across_many_inbound_batches_takes_each_message_once(
        spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=1))
    send_batches(declaration, "m", failing=True)
    end_conversation(declaration, "q", "x", 42, "gone", "alice", NOW)
    stats = QueueTables.of(declaration, "q").stats("inbound", NOW)
    assert stats.rows == 2 * BATCHES and len(stats.due_batches) == BATCHES
    report = run_cycle(spark, declaration, "q", "inbound", now=NOW)
    assert report.counts["messages"] == 2 * BATCHES
    assert_each_message_once(declaration, 3 * BATCHES)
    assert rows(declaration, "inbound") == []


def test_a_retry_cycle_after_ending_a_conversation_across_many_retry_batches_takes_each_message_once(
        spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=1))
    for b in range(4):  # one inbound cycle per batch: each writes a batch of its own into retry_1
        send(declaration, {f"r{b}-x": {"fail": True}}, conversation_id="x")
        send(declaration, {f"r{b}-a": {"fail_until_cycle": 1}, f"r{b}-b": {"fail_until_cycle": 1}})
        run_cycle(spark, declaration, "q", "inbound", now=NOW)
    end_conversation(declaration, "q", "x", 42, "gone", "alice", NOW)
    later = NOW + timedelta(seconds=1)
    report = run_cycle(spark, declaration, "q", "retry_1", now=later)
    assert report.counts["processed"] == 8
    assert_each_message_once(declaration, 12)
    assert rows(declaration, "retry_1") == []


def test_a_file_that_mixes_due_and_later_batches_waits_until_all_are_due(spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=1, retry_cycle_delay="1h"))
    for b in range(3):  # retry_1 batches due an hour after each cycle: 10:00, 10:30 and 11:00
        send(declaration, {f"d{b}-x": {"fail": True}}, conversation_id="x")
        send(declaration, {f"d{b}-a": {"fail_until_cycle": 1}})
        run_cycle(spark, declaration, "q", "inbound", now=NOW + timedelta(minutes=30 * b))
    end_conversation(declaration, "q", "x", 42, "gone", "alice", NOW)
    tables = QueueTables.of(declaration, "q")
    halfway = NOW + timedelta(hours=1, minutes=45)  # two of the three batches are due
    due = tables.stats("retry_1", halfway)
    # The rewrite left the three batches in one file: it is due when its last batch is.
    assert (due.due_rows, due.next_due) == (0, NOW + timedelta(hours=2))
    assert run_cycle(spark, declaration, "q", "retry_1", now=halfway).skipped == "no message is due"
    report = run_cycle(spark, declaration, "q", "retry_1", now=NOW + timedelta(hours=2))
    assert report.counts["processed"] == 3
    assert_each_message_once(declaration, 6)
    assert rows(declaration, "retry_1") == []


def test_a_batch_with_rows_in_a_file_not_yet_due_is_not_taken_from_a_due_file():
    # Files: rewritten (batches A, B), untouched (B), alone (C); one pair per file and batch.
    files, batches = np.array([0, 0, 1, 2]), pa.array(["A", "B", "B", "C"])
    # B still has rows that are not due: taking the rewritten file would remove them unread.
    assert _whole_due_files(np.array([True, False, True]), files, batches).tolist() == [False, False, True]
    assert _whole_due_files(np.array([True, True, True]), files, batches).tolist() == [True, True, True]
    # A chain: D waits in a file not due, so the due file of D and E is held back, and so is E's other file.
    files, batches = np.array([0, 1, 1, 2]), pa.array(["D", "D", "E", "E"])
    assert _whole_due_files(np.array([False, True, True]), files, batches).tolist() == [False, False, False]


def test_a_poison_cycle_after_a_redrive_across_many_poison_batches_takes_each_message_once(
        spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=0, receive_error_handling="move"))
    for b in range(4):  # one inbound cycle per batch: each writes a batch of its own into poison
        send(declaration, {f"p{b}-a": {"fail": True}, f"p{b}-b": {"fail": True}})
        run_cycle(spark, declaration, "q", "inbound", now=NOW)
    redrive_table(declaration, "q", "poison", Selection(ids=tuple(f"p{b}-a" for b in range(4))), now=NOW)
    report = run_cycle(spark, declaration, "q", "poison", now=NOW + timedelta(seconds=1))
    assert report.counts["messages"] == 4
    assert_each_message_once(declaration, 8)
    assert rows(declaration, "poison") == []
