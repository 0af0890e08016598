"""Conversation ordering on real Spark and Delta (SPEC sections 5 and 7, `ordering: conversation`):
sequence order across partitions, holding, joining, retrying / poisoning / ending as a whole."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from poison_pipeline.broker.conversations import ended_conversations
from poison_pipeline.domain.policy import Policy
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests import conversation_hooks
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import attempts_of, places, rows

HANDLER = "poison_pipeline_tests.recording_handlers:recording"
HOOK = "poison_pipeline_tests.conversation_hooks:record"


def ordered_queue(**policy: Any) -> dict[str, Any]:
    base = {"receive_retry_count": 0, "max_retry_cycles": 1, "retry_cycle_delay": 0,
            "receive_error_handling": "move", "ordering": "conversation"}
    return {"q": {"handler": HANDLER, "policy": {**base, **policy}}}


def msg(message_id: str, conversation: str | None, seq: int | None, log: Path, **body: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"message_id": message_id, "message_type": "test", "body": {"log": str(log), **body}}
    if conversation is not None:
        record["conversation_id"] = conversation
    if seq is not None:
        record["sequence_number"] = seq
    return record


def put(declaration, records: list[dict[str, Any]], **extra: Any) -> None:
    result = enqueue(declaration, "q", [{**r, **extra} for r in records])
    assert not result.refused, result.refused


def delivered(log: Path, cycle: int | None = None) -> dict[str, list[int]]:
    """conversation -> sequence numbers in the order the handler saw them (every attempt)."""
    seen: dict[str, list[int]] = defaultdict(list)
    for line in read_lines(log):
        if cycle is None or line["cycle"] == cycle:
            seen[line["conversation"]].append(line["seq"])
    return dict(seen)


def ledger(declaration) -> Counter[str]:
    return Counter(r["message_id"] for r in rows(declaration, "processed") if r["disposition"] == "processed")


@pytest.fixture
def two_partitions(spark) -> Iterator[None]:
    """Keep the shuffle's 2 partitions: adaptive execution would coalesce a small cycle into one,
    and the conversations must really be spread over several tasks."""
    key = "spark.sql.adaptive.coalescePartitions.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    yield
    spark.conf.set(key, before)


@pytest.fixture(autouse=True)
def hook_calls() -> Iterator[list[dict[str, Any]]]:
    # The clean-up hook runs on the driver (after the cycle's commit), in this process.
    conversation_hooks.CALLS.clear()
    yield conversation_hooks.CALLS
    conversation_hooks.CALLS.clear()


def test_conversations_keep_sequence_order_and_a_failure_holds_only_its_own(
        spark, make_declaration, tmp_path, two_partitions):
    # Through Spark: a small cycle is one partition, delivered by one worker.
    declaration = make_declaration(ordered_queue(receive_retry_count=1), small_cycles={"max_messages": 0})
    log = tmp_path / "deliveries.jsonl"
    records = []
    for c in range(40):
        for s in range(1, 6):
            body: dict[str, Any] = {}
            if (c, s) == (7, 3):
                body = {"fail_until_cycle": 1}  # fails its whole first cycle, then works
            if (c, s) == (21, 1):
                body = {"fail": True}  # never works: the whole conversation ends in poison
            records.append(msg(f"c{c:02d}-s{s}", f"c{c:02d}", s, log, **body))
    random.Random(5).shuffle(records)
    for k in range(4):  # four enqueue batches, each out of order
        put(declaration, records[k::4])

    first = run_cycle(spark, declaration, "q", "inbound")

    lines = read_lines(log)
    assert len({line["partition"] for line in lines}) == 2, "the conversations were spread over 2 tasks"
    order = delivered(log, cycle=0)
    for c in range(40):
        expected = {7: [1, 2, 3, 3], 21: [1, 1]}.get(c, [1, 2, 3, 4, 5])
        assert order[f"c{c:02d}"] == expected, f"c{c:02d} was delivered as {order[f'c{c:02d}']}"
    assert first.counts == {"processed": 192, "moved": 8, "messages": 200, "attempts": 196}
    where = places(declaration)
    # Every other conversation went through in this same cycle: never slowed.
    for c in set(range(40)) - {7, 21}:
        assert all(where[f"c{c:02d}-s{s}"] == ["processed:processed"] for s in range(1, 6))
    # Earlier messages that succeeded stay processed; the failed one and all later ones move together.
    assert where["c07-s1"] == where["c07-s2"] == ["processed:processed"]
    waiting = {r["message_id"]: r for r in rows(declaration, "retry_1")}
    assert set(waiting) == {"c07-s3", "c07-s4", "c07-s5", *(f"c21-s{s}" for s in range(1, 6))}
    for message_id, row in waiting.items():
        failed = message_id in ("c07-s3", "c21-s1")
        assert (row["abort_count"], row["move_count"]) == (0, 1), message_id
        assert row["total_abort_count"] == (2 if failed else 0), message_id
        if not failed:  # held: never attempted, carries no error of its own
            assert attempts_of(declaration, message_id) == [], message_id
            assert row["last_error_type"] is None, message_id

    second = run_cycle(spark, declaration, "q", "retry_1")

    retried = delivered(log, cycle=1)
    assert retried["c07"] == [3, 4, 5], "the held conversation is retried whole, in order"
    assert retried["c21"] == [1, 1], "later messages stay held behind the failing one"
    assert set(retried) == {"c07", "c21"}
    assert second.counts == {"processed": 3, "poisoned": 5, "messages": 8, "attempts": 5}
    poisoned = {r["message_id"]: r for r in rows(declaration, "poison")}
    assert set(poisoned) == {f"c21-s{s}" for s in range(1, 6)}
    assert poisoned["c21-s1"]["total_abort_count"] == 4
    # To retry_1, back, to poison: the held ones, never attempted, moved with the failing one.
    assert all(poisoned[f"c21-s{s}"]["move_count"] == 3 for s in range(1, 6))
    assert all(attempts_of(declaration, f"c21-s{s}") == [] for s in range(2, 6))
    processed = ledger(declaration)
    assert len(processed) == 195 and set(processed.values()) == {1}, "each processed exactly once"


def test_after_the_last_cycle_reject_dead_letters_the_whole_conversation(spark, make_declaration, tmp_path):
    declaration = make_declaration(ordered_queue(max_retry_cycles=0, receive_error_handling="reject"))
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("a3", "a", 3, log), msg("a1", "a", 1, log), msg("a2", "a", 2, log, fail=True),
                      msg("b1", "b", 1, log)], sender="shop")

    report = run_cycle(spark, declaration, "q", "inbound")

    assert delivered(log) == {"a": [1, 2], "b": [1]}
    assert report.counts == {"processed": 2, "rejected": 2, "messages": 4, "attempts": 3}
    dead = {r["message_id"]: r["reason"] for r in rows(declaration, "dead_letter")}
    assert dead == {"a2": "rejected", "a3": "held"}
    assert places(declaration)["a1"] == ["processed:processed"]
    assert attempts_of(declaration, "a3") == []
    nacks = {n["message_id"] for n in rows(declaration, "notifications") if n["kind"] == "negative_acknowledgement"}
    assert nacks == {"a2", "a3"}


def test_a_later_message_joins_its_conversation_waiting_in_a_retry_subqueue(spark, make_declaration, tmp_path):
    declaration = make_declaration(ordered_queue(retry_cycle_delay="1h"))
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("j1", "j", 1, log, fail_until_cycle=1)])
    run_cycle(spark, declaration, "q", "inbound")
    [waiting] = rows(declaration, "retry_1")
    assert waiting["message_id"] == "j1"

    put(declaration, [msg("j2", "j", 2, log), msg("k1", "k", 1, log)])
    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"processed": 1, "moved": 1, "messages": 2, "attempts": 1}
    assert attempts_of(declaration, "j2") == [], "it is not attempted ahead of j1"
    joined = {r["message_id"]: r for r in rows(declaration, "retry_1")}
    assert set(joined) == {"j1", "j2"}
    assert joined["j2"]["due_at"] == joined["j1"]["due_at"] == waiting["due_at"]
    assert (joined["j2"]["move_count"], joined["j2"]["abort_count"]) == (1, 0)
    assert places(declaration)["k1"] == ["processed:processed"]

    later = run_cycle(spark, declaration, "q", "retry_1", now=datetime.now(UTC) + timedelta(hours=2))

    assert later.counts["processed"] == 2
    assert delivered(log, cycle=1) == {"j": [1, 2]}
    assert {line["id"]: line["move_count"] for line in read_lines(log) if line["cycle"] == 1} == {"j1": 2, "j2": 2}


def test_a_message_joining_its_conversation_further_down_reads_that_cycles_move_count(spark, make_declaration,
                                                                                     tmp_path):
    declaration = make_declaration(ordered_queue(max_retry_cycles=2))
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("j1", "j", 1, log, fail_until_cycle=2)])
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "retry_1")

    put(declaration, [msg("j2", "j", 2, log)])
    run_cycle(spark, declaration, "q", "inbound")

    # j2 skipped retry_1, yet it waits in retry_2 as its conversation does: three moves so far.
    joined = {r["message_id"]: r["move_count"] for r in rows(declaration, "retry_2")}
    assert joined == {"j1": 3, "j2": 3}
    run_cycle(spark, declaration, "q", "retry_2")
    read = [(line["id"], line["cycle"], line["move_count"]) for line in read_lines(log)]
    assert read == [("j1", 0, 0), ("j1", 1, 2), ("j1", 2, 4), ("j2", 2, 4)]


def test_end_conversation_ends_it_with_an_error_everywhere_and_for_good(
        spark, make_declaration, tmp_path, hook_calls):
    assert Policy().conversation_error_code == 1
    spec = ordered_queue(on_conversation_poison="end_conversation", conversation_error_code=7)
    spec["q"]["on_conversation_end"] = HOOK
    declaration = make_declaration(spec)
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("e1", "e", 1, log), msg("e2", "e", 2, log, fail=True), msg("e3", "e", 3, log),
                      msg("f1", "f", 1, log)], sender="shop")
    run_cycle(spark, declaration, "q", "inbound")
    assert {r["message_id"] for r in rows(declaration, "retry_1")} == {"e2", "e3"}
    put(declaration, [msg("e4", "e", 4, log)], sender="shop")  # waits in inbound meanwhile

    report = run_cycle(spark, declaration, "q", "retry_1")

    assert report.counts["ended"] == 2 and report.counts["conversations_ended"] == 1
    dead = {r["message_id"]: (r["reason"], r["from_table"]) for r in rows(declaration, "dead_letter")}
    assert dead == {"e2": ("conversation_ended", "retry_1"), "e3": ("conversation_ended", "retry_1"),
                    "e4": ("conversation_ended", "inbound")}
    assert rows(declaration, "inbound") == [] and rows(declaration, "retry_1") == []
    assert places(declaration)["e1"] == ["processed:processed"]
    assert attempts_of(declaration, "e3") == [] and attempts_of(declaration, "e4") == []
    [ended] = rows(declaration, "conversations")
    assert (ended["conversation_id"], ended["state"], ended["code"]) == ("e", "ended", 7)
    assert "e2" in ended["description"] and "ValueError" in ended["description"]
    assert ended_conversations(QueueTables.of(declaration, "q")) == {"e": (7, ended["description"])}
    [error] = [n for n in rows(declaration, "notifications") if n["kind"] == "conversation_error"]
    assert (error["recipient"], error["conversation_id"], error["code"]) == ("shop", "e", 7)
    assert [(c["conversation_id"], c["code"]) for c in hook_calls] == [("e", 7)]

    put(declaration, [msg("e5", "e", 5, log)], sender="shop")
    late = run_cycle(spark, declaration, "q", "inbound")

    assert late.counts == {"ended": 1, "messages": 1, "attempts": 0}
    assert places(declaration)["e5"] == ["dead_letter"]
    [late_dead] = [r for r in rows(declaration, "dead_letter") if r["message_id"] == "e5"]
    assert late_dead["reason"] == "conversation_ended"
    assert attempts_of(declaration, "e5") == []
    assert len(hook_calls) == 1, "the clean-up hook runs once per conversation"
    assert len(rows(declaration, "conversations")) == 1
    assert {line["id"] for line in read_lines(log)} == {"e1", "e2", "f1"}


def test_a_small_cycle_keeps_sequence_order_in_its_one_worker(spark, make_declaration, tmp_path):
    declaration = make_declaration(ordered_queue(receive_retry_count=0))
    log = tmp_path / "deliveries.jsonl"
    records = [msg(f"c{c}-s{s}", f"c{c}", s, log, **({"fail": True} if (c, s) == (1, 2) else {}))
               for c in range(3) for s in range(1, 5)]
    random.Random(7).shuffle(records)
    put(declaration, records[:6])
    put(declaration, records[6:])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert {line["partition"] for line in read_lines(log)} == {None}, "delivered without a Spark task"
    order = delivered(log, cycle=0)
    assert order == {"c0": [1, 2, 3, 4], "c1": [1, 2], "c2": [1, 2, 3, 4]}
    assert report.counts == {"processed": 9, "moved": 3, "messages": 12, "attempts": 10}


def test_without_ordering_a_failure_holds_nothing(spark, make_declaration, tmp_path):
    declaration = make_declaration(ordered_queue(ordering="none"))
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("n1", "n", 1, log, fail=True), msg("n2", "n", 2, log)])

    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"processed": 1, "moved": 1, "messages": 2, "attempts": 2}
    assert places(declaration) == {"n1": ["retry_1"], "n2": ["processed:processed"]}


def test_drop_drops_the_whole_conversation(spark, make_declaration, tmp_path):
    declaration = make_declaration(ordered_queue(receive_error_handling="drop"))
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("m1", "c", 1, log, fail=True), msg("m2", "c", 2, log)])
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "retry_1")

    assert places(declaration)["m1"] == ["processed:dropped"]
    assert attempts_of(declaration, "m2") == [], "m2 must not be processed once m1 was dropped"
    assert places(declaration)["m2"] == ["processed:dropped"]


def test_a_waiting_message_never_moves_back_to_inbound(spark, make_declaration, tmp_path):
    declaration = make_declaration(ordered_queue())
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("m2", "c", 2, log, fail=True)])
    run_cycle(spark, declaration, "q", "inbound")
    put(declaration, [msg("m1", "c", 1, log)])  # arrives late, ahead of m2 in the conversation
    run_cycle(spark, declaration, "q", "retry_1")  # the retry sensor fires before the arrival sensor

    assert "inbound" not in places(declaration)["m2"], "a message must not move back up the flow"
    for table in ("inbound", "retry_1", "poison"):
        run_cycle(spark, declaration, "q", table)
    assert len(attempts_of(declaration, "m2")) <= Policy(receive_retry_count=0, max_retry_cycles=1).max_attempts
