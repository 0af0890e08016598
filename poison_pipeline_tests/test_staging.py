"""A big cycle's tasks write its staged results themselves (engine/staging.py): only the files of
the delivery that succeeded are committed."""

from __future__ import annotations

from poison_pipeline.engine.cycle import run_cycle
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import places, send


def test_a_staged_file_written_late_by_another_delivery_is_not_committed(spark, make_declaration):
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:leaves_late_staged_file"}},
                                   small_cycles={"max_messages": 0})
    staging = QueueTables.of(declaration, "q").work_uri("staging")
    send(declaration, {"a": {"staging": staging}, "b": {"staging": staging}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["processed"] == 2 and report.counts["messages"] == 2
    assert places(declaration) == {"a": ["processed:processed"], "b": ["processed:processed"]}
