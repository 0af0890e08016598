"""A big cycle's tasks write its staged results themselves (engine/staging.py): only the files of
the delivery that succeeded are committed."""

from __future__ import annotations

from datetime import UTC, datetime

from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import places, rows, send


def test_a_staged_file_written_late_by_another_delivery_is_not_committed(spark, make_declaration):
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:leaves_late_staged_file"}},
                                   small_cycles={"max_messages": 0})
    staging = QueueTables.of(declaration, "q").work_uri("staging")
    send(declaration, {"a": {"staging": staging}, "b": {"staging": staging}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["processed"] == 2 and report.counts["messages"] == 2
    assert places(declaration) == {"a": ["processed:processed"], "b": ["processed:processed"]}


def test_a_big_cycle_hands_over_every_field_whichever_columns_are_null_in_every_due_file(
        spark, make_declaration, tmp_path):
    # Columns null in every due file do not travel through the delivery job (engine/staging.py): the
    # handler must still read every field, and what a failure records must still be kept.
    declaration = make_declaration(
        {"q": {"handler": "poison_pipeline_tests.recording_handlers:recording",
               "policy": {"receive_retry_count": 0, "max_retry_cycles": 1, "retry_cycle_delay": 0,
                          "receive_error_handling": "move"}}},
        small_cycles={"max_messages": 0})
    log = tmp_path / "seen.jsonl"
    send(declaration, {"plain": {"log": str(log)}, "fails": {"log": str(log), "fail": True}})
    tables = QueueTables.of(declaration, "q")
    assert {"conversation_id", "sequence_number", "sender", "last_error_type"} <= set(
        tables.stats("inbound", datetime.now(UTC)).null_columns)
    run_cycle(spark, declaration, "q", "inbound")
    send(declaration, {"talk": {"log": str(log)}}, conversation_id="c-1", sequence_number=1)
    run_cycle(spark, declaration, "q", "inbound")
    seen = {(line["id"], line["conversation"], line["seq"]) for line in read_lines(log)}
    assert seen == {("plain", None, None), ("fails", None, None), ("talk", "c-1", 1)}
    (moved,) = rows(declaration, "retry_1")
    assert moved["message_id"] == "fails" and moved["abort_count"] == 0 and moved["total_abort_count"] == 1
    assert moved["last_error_type"] == "ValueError" and "always fails" in moved["last_error_message"]
    # In retry_1 the error columns hold values: they travel, and a second failure replaces them.
    run_cycle(spark, declaration, "q", "retry_1")
    (poisoned,) = rows(declaration, "poison")
    assert poisoned["message_id"] == "fails" and poisoned["total_abort_count"] == 2
    assert poisoned["last_error_type"] == "ValueError"
    assert places(declaration) == {"plain": ["processed:processed"], "talk": ["processed:processed"],
                                   "fails": ["poison"]}
