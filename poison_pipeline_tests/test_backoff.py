"""Retry shapes: exponential back-off with a cap and jitter, and retry rules per exception or code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from poison_pipeline.domain.backoff import Backoff
from poison_pipeline.domain.declaration import DeclarationError, parse_declaration
from poison_pipeline.domain.durations import spoken
from poison_pipeline.domain.policy import Policy
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.history import history
from poison_pipeline.operations.inspect_message import inspect_message
from poison_pipeline.text.history import format_history
from poison_pipeline.text.inspection import format_inspection
from poison_pipeline_tests.support import HANDLER, attempts_of, places, rows, send


def backoff(**fields: Any) -> Backoff:
    return Backoff.model_validate({"initial": "1m", "multiplier": 3, "max": "10m", **fields})


def seconds(delay: timedelta) -> float:
    return delay.total_seconds()


def test_without_jitter_each_cycle_waits_initial_times_multiplier_to_the_cycle_up_to_max():
    shape = backoff()
    assert [seconds(shape.delay(k, "m1")) for k in range(1, 6)] == [60, 180, 540, 600, 600]
    # A multiplier of 1 is a fixed delay; no cap grows it without bound (and never overflows).
    assert seconds(backoff(multiplier=1, max=None).delay(50, "m1")) == 60
    assert backoff(multiplier=10, max=None).delay(10_000, "m1") > timedelta(days=300_000)


@pytest.mark.parametrize(("jitter", "low", "high"), [
    ("full", 0.0, 1.0), ("equal", 0.5, 1.0), ("bounded(0.25)", 0.75, 1.0)])
def test_jitter_stays_within_its_bounds_and_the_cap_and_repeats_per_message(jitter, low, high):
    shape = backoff(jitter=jitter)
    for cycle, base in ((1, 60), (2, 180), (4, 600)):
        delays = [seconds(shape.delay(cycle, f"m{i}")) for i in range(400)]
        # Jitter only shortens a delay: `max` stays the longest.
        assert all(base * low <= d <= base * high for d in delays)
        # Spread over the range: not one value, not clustered at an end.
        assert len(set(delays)) > 390
        assert min(delays) < base * (low + (high - low) / 10) and max(delays) > base * (high - (high - low) / 10)
        # Seeded by the message and the cycle: the same history computes the same delays.
        assert delays == [seconds(shape.delay(cycle, f"m{i}")) for i in range(400)]
    assert shape.delay(1, "m1") != shape.delay(2, "m1") * 60 / 180


def test_the_policy_takes_a_fixed_delay_or_a_backoff():
    assert Policy(retry_cycle_delay=timedelta(seconds=5)).delay_before(3, "m") == timedelta(seconds=5)
    policy = Policy.model_validate({"backoff": {"initial": "10s", "multiplier": 2}})
    assert [policy.delay_before(k, "m") for k in (1, 2, 3)] == [timedelta(seconds=s) for s in (10, 20, 40)]


@pytest.mark.parametrize(("policy", "names"), [
    ({"backoff": {"initial": "1m", "multiplier": -2}}, ["queues.q.policy.backoff.multiplier", "-2",
                                                          "at least 1"]),
    ({"backoff": {"initial": "10m", "max": "1m"}}, ["queues.q.policy.backoff", "max (60s) is below initial (600s)"]),
    ({"backoff": {"initial": "0s"}}, ["queues.q.policy.backoff.initial", "greater than zero"]),
    ({"backoff": {"initial": "1m", "jitter": "some"}}, ["queues.q.policy.backoff.jitter", "'some'", "bounded(F)"]),
    ({"backoff": {"initial": "1m", "jitter": "bounded(1.5)"}}, ["bounded(1.5)", "at most 1"]),
    ({"backoff": {"initial": "1m", "factor": 2}}, ["queues.q.policy.backoff.factor"]),
    ({"backoff": {"initial": "1m"}, "retry_cycle_delay": "5m"}, ["retry_cycle_delay", "or backoff, not both"]),
    ({"rules": [{"exceptions": ["ValueError"]}]}, ["queues.q.policy.rules.0", "a rule changes something"]),
    ({"rules": [{"receive_retry_count": 0}]}, ["queues.q.policy.rules.0", "give it exceptions or codes"]),
    ({"rules": [{"codes": [7], "receive_retry_count": -1}]}, ["queues.q.policy.rules.0.receive_retry_count"]),
    ({"rules": [{"codes": [7], "receive_error_handling": "bounce"}]},
     ["queues.q.policy.rules.0.receive_error_handling", "'bounce'"]),
    ({"max_retry_cycles": 1, "rules": [{"codes": [7], "max_retry_cycles": 3}]},
     ["rules[0].max_retry_cycles is 3", "policy's max_retry_cycles (1)"]),
    ({"rules": [{"exceptions": ["no such thing"], "max_retry_cycles": 0}]},
     ["queues.q.policy.rules.0.exceptions", "'no such thing' is not an import path"]),
])
def test_a_bad_retry_shape_is_refused_naming_field_value_and_rule(policy, names):
    with pytest.raises(DeclarationError) as refused:
        parse_declaration({"lake_root": "/nowhere", "queues": {"q": {"handler": HANDLER, "policy": policy}}})
    for name in names:
        assert name in str(refused.value)


def test_a_rule_takes_the_first_match_and_keeps_the_rest_of_the_policy():
    policy = Policy.model_validate({
        "receive_retry_count": 4, "max_retry_cycles": 2, "retry_cycle_delay": "1m",
        "rules": [{"exceptions": ["LookupError"], "max_retry_cycles": 0},
                  {"exceptions": ["KeyError"], "receive_retry_count": 9},
                  {"codes": [42], "backoff": {"initial": "5s"}}]})
    looked_up = policy.under(0)
    assert (looked_up.max_retry_cycles, looked_up.receive_retry_count) == (0, 4)
    assert policy.under(2).delay_before(2, "m") == timedelta(seconds=10)
    assert policy.under(None) is policy


def spec(policy: dict[str, Any]) -> dict[str, Any]:
    return {"q": {"handler": HANDLER, "policy": policy}}


def test_a_cycle_stores_each_message_due_after_its_own_backoff_delay(spark, make_declaration):
    declaration = make_declaration(spec({
        "receive_retry_count": 0, "max_retry_cycles": 3,
        "backoff": {"initial": "1m", "multiplier": 4, "max": "10m", "jitter": "bounded(0.5)"}}))
    send(declaration, {f"m{i}": {"fail": True} for i in range(6)})
    policy = declaration.queue("q").policy
    start = datetime.now(UTC)
    run_cycle(spark, declaration, "q", "inbound", now=start)
    due = {r["message_id"]: r["due_at"] - start for r in rows(declaration, "retry_1")}
    assert due == {f"m{i}": policy.delay_before(1, f"m{i}") for i in range(6)}
    assert len(set(due.values())) == 6
    assert all(timedelta(seconds=30) <= d <= timedelta(seconds=60) for d in due.values())

    # A retry cycle takes a cycle's batch whole, once every message of it is due: none waits less
    # than its own delay.
    last = max(due.values())
    run_cycle(spark, declaration, "q", "retry_1", now=start + last - timedelta(milliseconds=1))
    assert rows(declaration, "retry_2") == []
    run_cycle(spark, declaration, "q", "retry_1", now=start + last)
    again = {r["message_id"]: r["due_at"] - (start + last) for r in rows(declaration, "retry_2")}
    assert again == {f"m{i}": policy.delay_before(2, f"m{i}") for i in range(6)}
    assert all(timedelta(seconds=120) <= d <= timedelta(seconds=240) for d in again.values())

    # Each computed delay is on record: in the attempts ledger, `inspect` and `history`.
    delays = [a["retry_delay_ms"] for a in attempts_of(declaration, "m3")]
    assert delays == [due["m3"] / timedelta(milliseconds=1), again["m3"] / timedelta(milliseconds=1)]
    shown = [f"next retry cycle after {spoken(due['m3'])}", f"next retry cycle after {spoken(again['m3'])}"]
    inspected = format_inspection(inspect_message(declaration, "m3"), now=start)
    journey = history(declaration, "m3")
    assert [e.retry_delay_s for e in journey.events if e.kind == "attempt"] == [d / 1000 for d in delays]
    for text in (inspected, format_history(journey)):
        assert all(line in text for line in shown), text


def test_a_rule_per_exception_overrides_counts_and_final_disposition(spark, make_declaration):
    declaration = make_declaration(spec({
        "receive_retry_count": 2, "max_retry_cycles": 1, "retry_cycle_delay": "1m",
        "receive_error_handling": "move",
        # A profile that does not exist yet (LookupError): one attempt per cycle, dead-lettered
        # after them (rejected); an unfixable code: straight to the poison queue... after one attempt.
        "rules": [{"exceptions": ["LookupError"], "receive_retry_count": 0, "receive_error_handling": "reject",
                   "retry_cycle_delay": "10m"},
                  {"codes": ["UNFIXABLE"], "receive_retry_count": 0, "max_retry_cycles": 0}]}))
    send(declaration, {"lookup": {"fail_until_cycle": 9}, "value": {"fail": True}, "unfixable": {"unfixable": True}})
    start = datetime.now(UTC)
    run_cycle(spark, declaration, "q", "inbound", now=start)
    assert [len(attempts_of(declaration, m)) for m in ("lookup", "value", "unfixable")] == [1, 3, 1]
    assert attempts_of(declaration, "unfixable")[0]["error_code"] == "UNFIXABLE"
    waiting = {r["message_id"]: r["due_at"] - start for r in rows(declaration, "retry_1")}
    assert waiting == {"lookup": timedelta(minutes=10), "value": timedelta(minutes=1)}
    assert places(declaration)["unfixable"] == ["poison"]

    run_cycle(spark, declaration, "q", "retry_1", now=start + timedelta(minutes=10))
    assert places(declaration)["lookup"] == ["dead_letter"]
    assert places(declaration)["value"] == ["poison"]
    assert [len(attempts_of(declaration, m)) for m in ("lookup", "value")] == [2, 6]
