"""The retry cycle on real Spark and Delta: routing, counts, dispositions (SPEC sections 5, 6)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import attempts_of, places, queue, rows, send

RECORDING = "poison_pipeline_tests.recording_handlers:recording"


def drain(spark, declaration, name: str = "q") -> None:
    """Run every waiting table's cycle in flow order until nothing is due."""
    for table in QueueTables.of(declaration, name).waiting:
        run_cycle(spark, declaration, name, table)


def test_success_failure_and_transient_are_routed(spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=2, max_retry_cycles=0,
                                         receive_error_handling="move"))
    send(declaration, {"ok": {}, "bad": {"fail": True}, "deadlock": {"fail_until_attempt": 2}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["processed"] == 2 and report.counts["poisoned"] == 1
    assert places(declaration) == {
        "ok": ["processed:processed"], "deadlock": ["processed:processed"], "bad": ["poison"]}
    assert [a["outcome"] for a in attempts_of(declaration, "deadlock")] == ["abort", "success"]


def test_attempt_bound_and_counts_follow_wcf(spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=2, max_retry_cycles=2,
                                         receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    [waiting] = rows(declaration, "retry_1")
    assert (waiting["abort_count"], waiting["total_abort_count"], waiting["move_count"]) == (0, 3, 1)
    run_cycle(spark, declaration, "q", "retry_1")
    [waiting] = rows(declaration, "retry_2")
    assert (waiting["total_abort_count"], waiting["move_count"]) == (6, 3)
    run_cycle(spark, declaration, "q", "retry_2")
    [poisoned] = rows(declaration, "poison")
    attempts = attempts_of(declaration, "bad")
    assert len(attempts) == (2 + 1) * (2 + 1) == poisoned["total_abort_count"]
    assert [(a["cycle"], a["attempt"]) for a in attempts] == [(c, n) for c in range(3) for n in (1, 2, 3)]
    assert poisoned["move_count"] == 5 and poisoned["last_error_type"] == "ValueError"


def moves_read(log: Path) -> list[tuple[str, int, int]]:
    """(message id, cycle, move count) of every attempt the recording handler logged, in order."""
    return [(line["id"], line["cycle"], line["move_count"]) for line in read_lines(log)]


def test_move_count_is_counted_as_msmq_counts_it(spark, make_declaration, tmp_path):
    spec = queue(receive_retry_count=0, max_retry_cycles=2, retry_cycle_delay="30m",
                 receive_error_handling="move")
    spec["q"]["handler"] = RECORDING
    spec["q"]["poison_queue"] = {"handler": RECORDING}
    declaration = make_declaration(spec)
    log = tmp_path / "deliveries.jsonl"
    # `late` works in retry cycle 1; `bad` fails every cycle and works in the poison queue (cycle 3).
    send(declaration, {"late": {"log": str(log), "fail_until_cycle": 1},
                       "bad": {"log": str(log), "fail_until_cycle": 3}})
    start = datetime.now(UTC)

    run_cycle(spark, declaration, "q", "inbound", now=start)
    # One move, to the retry subqueue; the handler of retry cycle 1 reads two, with the move back.
    assert {r["message_id"]: r["move_count"] for r in rows(declaration, "retry_1")} == {"late": 1, "bad": 1}
    run_cycle(spark, declaration, "q", "retry_1", now=start + timedelta(minutes=31))
    [waiting] = rows(declaration, "retry_2")
    assert (waiting["message_id"], waiting["move_count"]) == ("bad", 3)
    run_cycle(spark, declaration, "q", "retry_2", now=start + timedelta(minutes=62))
    [poisoned] = rows(declaration, "poison")
    assert poisoned["move_count"] == 5, "back from retry_2, then to the poison queue"
    run_cycle(spark, declaration, "q", "poison", now=start + timedelta(minutes=63))

    assert sorted(moves_read(log)) == [("bad", 0, 0), ("bad", 1, 2), ("bad", 2, 4), ("bad", 3, 5),
                                       ("late", 0, 0), ("late", 1, 2)]
    ledger = {r["message_id"]: (r["disposition"], r["from_table"], r["move_count"])
              for r in rows(declaration, "processed")}
    assert ledger == {"late": ("processed", "retry_1", 2), "bad": ("processed", "poison", 5)}


def test_a_faulted_message_left_in_its_retry_subqueue_reads_the_same_count_again(spark, make_declaration,
                                                                               tmp_path):
    spec = queue(receive_retry_count=0, max_retry_cycles=1, receive_error_handling="fault")
    spec["q"]["handler"] = RECORDING
    declaration = make_declaration(spec)
    log = tmp_path / "deliveries.jsonl"
    send(declaration, {"bad": {"log": str(log), "fail_until_cycle": 2}})
    drain(spark, declaration)
    # Faulted in cycle 1 it stays in retry_1 with its one move: it never left the subqueue.
    [stays] = rows(declaration, "retry_1")
    assert stays["move_count"] == 1
    set_enabled(QueueTables.of(declaration, "q"), True, "test", "fixed")
    run_cycle(spark, declaration, "q", "retry_1")
    assert moves_read(log) == [("bad", 0, 0), ("bad", 1, 2), ("bad", 1, 2)]
    [faulted_again] = rows(declaration, "retry_1")
    assert faulted_again["move_count"] == 1


def test_message_that_succeeds_on_a_later_cycle_is_processed(spark, make_declaration):
    declaration = make_declaration(queue(max_retry_cycles=2, receive_error_handling="move"))
    send(declaration, {"late": {"fail_until_cycle": 1}})
    drain(spark, declaration)
    assert places(declaration) == {"late": ["processed:processed"]}
    assert len(attempts_of(declaration, "late")) == 3


def test_drop_discards_and_records_the_drop(spark, make_declaration):
    declaration = make_declaration(queue(max_retry_cycles=0, receive_error_handling="drop"))
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration) == {"bad": ["processed:dropped"]}


def test_reject_dead_letters_and_notifies_the_sender(spark, make_declaration):
    declaration = make_declaration(queue(max_retry_cycles=0, receive_error_handling="reject"))
    send(declaration, {"bad": {"fail": True}}, sender="storefront-1")
    run_cycle(spark, declaration, "q", "inbound")
    [dead] = rows(declaration, "dead_letter")
    assert (dead["message_id"], dead["reason"]) == ("bad", "rejected")
    [nack] = rows(declaration, "notifications")
    assert (nack["recipient"], nack["kind"], nack["message_id"]) == (
        "storefront-1", "negative_acknowledgement", "bad")


def test_fault_keeps_the_message_disables_the_queue_and_writes_an_event(spark, make_declaration):
    declaration = make_declaration(queue(max_retry_cycles=0, receive_error_handling="fault"))
    send(declaration, {"bad": {"fail": True}, "ok": {}})
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration) == {"bad": ["inbound"], "ok": ["processed:processed"]}
    tables = QueueTables.of(declaration, "q")
    state = queue_state(tables)
    assert not state.enabled and "bad" in state.reason
    [event] = rows(declaration, "events")
    assert event["kind"] == "queue_disabled" and event["message_id"] == "bad"
    send(declaration, {"later": {}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.skipped and "disabled" in report.skipped
    assert "later" in places(declaration) and places(declaration)["later"] == ["inbound"]


def test_poison_queue_default_handler_quarantines_with_error(spark, make_declaration):
    declaration = make_declaration(queue(max_retry_cycles=0, receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    drain(spark, declaration)
    [kept] = rows(declaration, "quarantine")
    assert kept["body"] == b'{"fail":true}' and kept["last_error_type"] == "ValueError"
    assert kept["last_error_stack"] and kept["from_table"] == "poison"


def test_poison_queue_handler_with_its_own_retries_and_reject(spark, make_declaration):
    spec = queue(max_retry_cycles=0, receive_error_handling="move")
    spec["q"]["poison_queue"] = {"handler": "poison_pipeline_tests.handlers:always_fails",
                                 "receive_retry_count": 2, "receive_error_handling": "reject"}
    declaration = make_declaration(spec)
    send(declaration, {"bad": {"fail": True}})
    drain(spark, declaration)
    assert places(declaration) == {"bad": ["dead_letter"]}
    poison_attempts = [a for a in attempts_of(declaration, "bad") if a["table"] == "poison"]
    assert len(poison_attempts) == 3


def test_expired_message_is_never_delivered(spark, make_declaration):
    declaration = make_declaration(queue())
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    send(declaration, {"old": {}}, expires_at=past)
    run_cycle(spark, declaration, "q", "inbound")
    [dead] = rows(declaration, "dead_letter")
    assert dead["reason"] == "expired"
    assert attempts_of(declaration, "old") == []


def test_drop_of_an_expired_message_goes_to_dead_letter(spark, make_declaration):
    declaration = make_declaration(queue(max_retry_cycles=1, receive_error_handling="drop"))
    soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    send(declaration, {"bad": {"fail": True}}, expires_at=soon)
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "retry_1", now=datetime.now(UTC) + timedelta(seconds=5))
    assert places(declaration) == {"bad": ["dead_letter"]}
    assert rows(declaration, "dead_letter")[0]["reason"] == "expired"


def test_handler_timeout_aborts_the_attempt(spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=0,
                                         receive_error_handling="move", handler_timeout="300ms"))
    send(declaration, {"slow": {"sleep": 5}, "quick": {}})
    run_cycle(spark, declaration, "q", "inbound")
    [attempt] = attempts_of(declaration, "slow")
    assert attempt["outcome"] == "timeout" and attempt["error_type"].endswith("HandlerTimeout")
    assert attempt["duration_ms"] < 3000
    assert places(declaration)["quick"] == ["processed:processed"]


@pytest.mark.parametrize(("route", "expected"), [("final_disposition", "poison"),
                                                 ("quarantine", "quarantine")])
def test_unrecoverable_errors_skip_retries(spark, make_declaration, route, expected):
    declaration = make_declaration(queue(
        receive_retry_count=5, max_retry_cycles=2, receive_error_handling="move",
        unrecoverable={"exceptions": ["poison_pipeline_tests.handlers:Unfixable"], "route": route}))
    send(declaration, {"never": {"unfixable": True}})
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration) == {"never": [expected]}
    assert len(attempts_of(declaration, "never")) == 1


def test_unrecoverable_by_error_code(spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=5, max_retry_cycles=2,
                                         receive_error_handling="reject",
                                         unrecoverable={"codes": ["UNFIXABLE"]}))
    send(declaration, {"never": {"unfixable": True}})
    run_cycle(spark, declaration, "q", "inbound")
    assert places(declaration) == {"never": ["dead_letter"]}


def test_retry_subqueue_waits_for_the_delay(spark, make_declaration):
    declaration = make_declaration(queue(retry_cycle_delay="1h", receive_error_handling="move"))
    send(declaration, {"bad": {"fail": True}})
    run_cycle(spark, declaration, "q", "inbound")
    early = run_cycle(spark, declaration, "q", "retry_1")
    assert early.skipped == "no message is due" and places(declaration) == {"bad": ["retry_1"]}
    later = run_cycle(spark, declaration, "q", "retry_1", now=datetime.now(UTC) + timedelta(hours=2))
    assert later.counts["poisoned"] == 1


def test_one_failing_message_never_affects_its_batch_mates(spark, make_declaration):
    declaration = make_declaration(queue(receive_retry_count=0, max_retry_cycles=0,
                                         receive_error_handling="move"))
    bodies = {f"m{i}": ({"fail": True} if i % 50 == 0 else {}) for i in range(400)}
    send(declaration, bodies)
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts == {"processed": 392, "poisoned": 8, "messages": 400, "attempts": 400}


def test_the_journal_is_checkpointed_every_ten_commits(spark, make_declaration):
    """Every cycle commits to its queue's journal three times and loads it four: with delta-rs's
    default interval a load reads up to 99 commits (a request each on an object store), with 10 at
    most 9."""
    declaration = make_declaration(queue())
    tables = QueueTables.of(declaration, "q")
    for i in range(4):
        send(declaration, {f"m{i}": {}})
        run_cycle(spark, declaration, "q", "inbound")
    log = Path(tables.uri("journal")) / "_delta_log"
    assert tables.open("journal").version() >= 10
    assert sorted(p.name.split(".")[0] for p in log.glob("*.checkpoint.parquet")) == [f"{9:020d}"]
