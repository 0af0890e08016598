"""A handler that kills its Python worker: the death is an aborted attempt of that message only
(SPEC sections 3 and 10), found by a careful re-run of the cycle's delivery: a Spark job, or the
worker process of a small cycle, beside the driver."""

from __future__ import annotations

import pytest

from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline_tests.support import attempts_of, places, queue, rows, send

# Spark jobs, and small cycles' worker processes.
PATHS = pytest.mark.parametrize("max_messages", [0, 1000], ids=["spark", "small"])


@PATHS
def test_a_handler_that_kills_its_worker_is_charged_and_moved_the_rest_is_processed(spark, make_declaration,
                                                                                    max_messages):
    declaration = make_declaration(queue(receive_retry_count=1, max_retry_cycles=0, receive_error_handling="move"),
                                   small_cycles={"max_messages": max_messages})
    send(declaration, {"good-1": {}, "killer": {"exit": True}, "good-2": {}, "flaky": {"fail_until_attempt": 2}})
    report = run_cycle(spark, declaration, "q", "inbound")
    # The first job dies, the careful re-run names the killer, and it dies once more per attempt.
    assert report.worker_deaths == 3
    assert places(declaration) == {"good-1": ["processed:processed"], "good-2": ["processed:processed"],
                                   "flaky": ["processed:processed"], "killer": ["poison"]}
    assert [(a["attempt"], a["outcome"], a["error_type"]) for a in attempts_of(declaration, "killer")] == [
        (1, "crash", "WorkerDied"), (2, "crash", "WorkerDied")]
    [killer] = rows(declaration, "poison")
    assert killer["total_abort_count"] == 2 and killer["move_count"] == 1
    assert killer["last_error_type"] == "WorkerDied"
    # Nothing of the failed jobs was committed: every other message made its attempts once.
    assert [a["outcome"] for a in attempts_of(declaration, "good-1")] == ["success"]
    assert [a["outcome"] for a in attempts_of(declaration, "flaky")] == ["abort", "success"]


@PATHS
def test_the_session_still_works_after_a_worker_died(spark, make_declaration, max_messages):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=0, receive_error_handling="drop"),
                                   small_cycles={"max_messages": max_messages})
    send(declaration, {"killer": {"exit": True}})
    assert run_cycle(spark, declaration, "q", "inbound").counts["dropped"] == 1
    send(declaration, {"after": {}})
    assert run_cycle(spark, declaration, "q", "inbound").counts["processed"] == 1
