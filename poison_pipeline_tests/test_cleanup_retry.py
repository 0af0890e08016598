"""A clean-up hook that fails during a cycle is shown (run log, metadata, status) and retried by
every following cycle until it succeeds (hooks are documented as safe to repeat)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from dagster import DagsterInstance

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.naming import job_name
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.status import queue_status
from poison_pipeline.text.status import format_status
from poison_pipeline_tests import conversation_hooks
from poison_pipeline_tests.support import send
from poison_pipeline_tests.test_dagster import QUIET

FLAKY = "poison_pipeline_tests.conversation_hooks:flaky"


@pytest.fixture(autouse=True)
def hook_calls() -> Iterator[list[dict[str, Any]]]:
    conversation_hooks.CALLS.clear()
    yield conversation_hooks.CALLS
    conversation_hooks.CALLS.clear()
    conversation_hooks.FAILURES_LEFT[0] = 0


def declare(make_declaration):
    return make_declaration({"q": {
        "handler": "poison_pipeline_tests.handlers:scripted",
        "on_conversation_end": FLAKY,
        "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "drop",
                   "ordering": "conversation", "on_conversation_poison": "end_conversation"},
    }})


def test_a_failing_hook_is_reported_and_retried_every_cycle_until_it_succeeds(spark, make_declaration, hook_calls):
    declaration = declare(make_declaration)
    conversation_hooks.FAILURES_LEFT[0] = 2
    send(declaration, {"slide-3": {"fail": True}}, conversation_id="deck-1", sequence_number=3)
    first = run_cycle(spark, declaration, "q", "inbound")
    assert first.counts["conversations_ended"] == 1
    [unfinished] = first.cleanup_failures
    assert unfinished.conversation_id == "deck-1" and unfinished.failures == 1
    assert "StateStoreDown: cannot drop the state of deck-1" in unfinished.last_error
    status = format_status([queue_status(declaration, "q", datetime.now(UTC))])
    assert "CLEAN-UP HOOK FAILING for 1 ended conversation(s)" in status and "'deck-1': 1 failed tries" in status

    second = run_cycle(spark, declaration, "q", "inbound")  # nothing is due: the hook is retried anyway
    assert second.skipped == "no message is due"
    assert [u.failures for u in second.cleanup_failures] == [2]
    third = run_cycle(spark, declaration, "q", "inbound")
    assert third.cleanup_failures == [] and [c["conversation_id"] for c in hook_calls] == ["deck-1"]
    run_cycle(spark, declaration, "q", "inbound")
    assert len(hook_calls) == 1  # once it has run, it is never run again
    assert queue_status(declaration, "q", datetime.now(UTC)).unfinished_cleanups == ()


def test_a_run_whose_hook_fails_warns_and_counts_it_in_metadata(spark, make_declaration):
    declaration = declare(make_declaration)
    conversation_hooks.FAILURES_LEFT[0] = 1
    send(declaration, {"slide-3": {"fail": True}}, conversation_id="deck-1", sequence_number=3)
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def(job_name("q", "inbound")).execute_in_process(
            instance=instance, run_config=QUIET)
        warnings = [e.message for e in instance.all_logs(result.run_id) if e.level >= 30]
    events = {e.asset_key.path[-1]: e for e in result.get_asset_materialization_events()}
    # The ended conversation's message went to dead_letter, which the run reports as well.
    assert set(events) == {"inbound", "dead_letter"}
    assert events["inbound"].step_materialization_data.materialization.metadata["cleanup_hook_failures"].value == 1
    assert any("clean-up hook of ended conversation 'deck-1' has not succeeded" in w for w in warnings), warnings



def test_a_hook_past_the_hook_timeout_counts_as_failed_and_is_tried_again(spark, make_declaration, hook_calls):
    queues = {"q": {
        "handler": "poison_pipeline_tests.handlers:scripted",
        "on_conversation_end": "poison_pipeline_tests.conversation_hooks:slow",
        "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "drop",
                   "ordering": "conversation", "on_conversation_poison": "end_conversation"},
    }}
    declaration = make_declaration(queues, hook_timeout="1s")
    conversation_hooks.SLEEP[0] = 30.0
    try:
        send(declaration, {"slide-3": {"fail": True}}, conversation_id="deck-1", sequence_number=3)
        started = time.monotonic()
        first = run_cycle(spark, declaration, "q", "inbound")
        assert time.monotonic() - started < 25, "the cycle waited for the hook past its timeout"
        [unfinished] = first.cleanup_failures
        assert "HookTimeout: the hook poison_pipeline_tests.conversation_hooks:slow ran longer than the " \
               "hook_timeout of 1s" in unfinished.last_error
        assert hook_calls == []
    finally:
        conversation_hooks.SLEEP[0] = 0.0
    second = run_cycle(spark, declaration, "q", "inbound")
    assert second.cleanup_failures == [] and [c["conversation_id"] for c in hook_calls] == ["deck-1"]


def test_the_hook_timeout_must_be_positive(make_declaration):
    with pytest.raises(ValueError, match="hook_timeout must be a positive duration"):
        make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:scripted"}}, hook_timeout="0s")
