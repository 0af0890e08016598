"""Ending a conversation with an error, on real Delta tables (delta-rs only, no Spark)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake.exceptions import DeltaError

from poison_pipeline.broker import conversations
from poison_pipeline.broker.conversations import (
    ConversationError,
    end_conversation,
    ended_conversations,
)
from poison_pipeline.domain.declaration import Declaration, DeclarationError, parse_declaration
from poison_pipeline.domain.envelope import parse_envelope
from poison_pipeline.operations.inspect_message import inspect_message
from poison_pipeline.operations.records import enqueue, message_rows
from poison_pipeline.operations.status import queue_status
from poison_pipeline.storage.tables import CONVERSATIONS, EVENTS, NOTIFICATIONS, QueueTables
from poison_pipeline.storage.writer import QueueWriter
from poison_pipeline.text.status import format_status
from poison_pipeline_tests import conversation_hooks
from poison_pipeline_tests.support import rows, seed, table_versions

HANDLER = "poison_pipeline_tests.handlers:scripted"
RECORD = "poison_pipeline_tests.conversation_hooks:record"
FLAKY = "poison_pipeline_tests.conversation_hooks:flaky"
NOW = datetime(2030, 1, 1, tzinfo=UTC)
END = {"conversation_id": "c-1", "code": 42, "description": "part 7 is obsolete", "actor": "alice"}
# Where the scenario puts the messages of conversation c-1, and who sent them.
C1 = {"m-1": ("inbound", "shop"), "m-2": ("inbound", "shop"), "m-3": ("retry_1", "warehouse"),
      "m-4": ("poison", None)}
OTHERS = {"o-1": "inbound", "n-1": "inbound", "o-2": "retry_1"}


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


@pytest.fixture(autouse=True)
def hook_calls() -> Iterator[list[dict[str, Any]]]:
    conversation_hooks.CALLS.clear()
    conversation_hooks.FAILURES_LEFT[0] = 0
    yield conversation_hooks.CALLS
    conversation_hooks.CALLS.clear()


def declare(make_declaration: Callable[[dict[str, Any]], Declaration], hook: str | None = RECORD) -> Declaration:
    queue: dict[str, Any] = {"handler": HANDLER, "policy": {"max_retry_cycles": 1}}
    if hook is not None:
        queue["on_conversation_end"] = hook
    return make_declaration({"q": queue})


def envelope(message_id: str, conversation: str | None = "c-1", sender: str | None = "shop") -> dict[str, Any]:
    record: dict[str, Any] = {"message_id": message_id, "message_type": "t", "body": {"id": message_id}}
    if conversation is not None:
        record["conversation_id"] = conversation
    if sender is not None:
        record["sender"] = sender
    return record


def place(declaration: Declaration, table: str, records: list[dict[str, Any]], batch_id: str) -> None:
    """Write messages straight into a waiting table, as a cycle's output batch would be."""
    tables = QueueTables.of(declaration, "q")
    tables.ensure()
    envelopes = [parse_envelope(r, NOW) for r in records]
    seed(tables, table, message_rows(envelopes, batch_id, NOW))


@pytest.fixture
def lake(make_declaration) -> Declaration:
    """c-1 has messages in inbound, retry_1 and poison; c-2 and a message without a conversation
    share inbound and retry_1 with it (o-2 even shares m-3's batch, so its file is rewritten)."""
    declaration = declare(make_declaration)
    result = enqueue(declaration, "q", [envelope("m-1"), envelope("o-1", "c-2"), envelope("m-2"),
                                        envelope("n-1", None)], now=NOW)
    assert result.accepted == 4, result.refused
    place(declaration, "retry_1", [envelope("m-3", sender="warehouse"), envelope("o-2", "c-2")], "retry_1-1-run")
    place(declaration, "poison", [envelope("m-4", sender=None)], "poison-1-run")
    return declaration


def ids(declaration: Declaration, table: str) -> list[str]:
    return sorted(r["message_id"] for r in rows(declaration, table))


def dead_letters(declaration: Declaration) -> list[tuple[str, str, str]]:
    return sorted((r["message_id"], r["from_table"], r["reason"]) for r in rows(declaration, "dead_letter"))


def events(declaration: Declaration) -> Counter[str]:
    return Counter(r["kind"] for r in rows(declaration, EVENTS))


def assert_fully_ended(declaration: Declaration, calls: list[dict[str, Any]]) -> None:
    """Every effect of ending c-1 is there exactly once."""
    assert dead_letters(declaration) == [(mid, table, "conversation_ended") for mid, (table, _) in sorted(C1.items())]
    assert ids(declaration, "inbound") == ["n-1", "o-1"]
    assert ids(declaration, "retry_1") == ["o-2"]
    assert ids(declaration, "poison") == []
    assert sorted(r["recipient"] for r in rows(declaration, NOTIFICATIONS)) == ["shop", "warehouse"]
    assert len(rows(declaration, CONVERSATIONS)) == 1
    assert events(declaration) == {"conversation_ended": 1, "conversation_cleanup": 1}
    assert calls == [{"conversation_id": "c-1", "code": 42, "description": "part 7 is obsolete", "queue": "q"}]


def test_every_waiting_message_of_the_conversation_leaves_for_dead_letter(lake: Declaration, hook_calls) -> None:
    result = end_conversation(lake, "q", now=NOW + timedelta(hours=1), **END)

    assert (result.already_ended, result.code, result.description, result.actor) == (
        False, 42, "part 7 is obsolete", "alice")
    assert result.removed == {"inbound": 2, "retry_1": 1, "poison": 1}
    assert result.removed_total == 4
    assert result.notified == ("shop", "warehouse")
    assert (result.hook, result.hook_ran, result.hook_ran_before, result.hook_error) == (RECORD, True, False, None)
    assert result.kind == "application error"
    assert_fully_ended(lake, hook_calls)
    moved = {r["message_id"]: r for r in rows(lake, "dead_letter")}
    # The envelope travels whole: body, sender and batch are those of the waiting row.
    assert moved["m-3"]["body"] == b'{"id":"m-3"}' and moved["m-3"]["batch_id"] == "retry_1-1-run"
    assert moved["m-3"]["dead_lettered_at"] == NOW + timedelta(hours=1)


def test_senders_are_notified_with_code_and_description(lake: Declaration) -> None:
    end_conversation(lake, "q", now=NOW, **END)

    notes = sorted(rows(lake, NOTIFICATIONS), key=lambda r: r["recipient"])
    assert [(n["recipient"], n["kind"], n["conversation_id"], n["code"], n["description"], n["message_id"])
            for n in notes] == [
        ("shop", "conversation_error", "c-1", 42, "part 7 is obsolete", None),
        ("warehouse", "conversation_error", "c-1", 42, "part 7 is obsolete", None),
    ]


def test_the_end_is_recorded_with_who_when_and_why(lake: Declaration) -> None:
    end_conversation(lake, "q", now=NOW, **END)

    assert rows(lake, CONVERSATIONS) == [{"conversation_id": "c-1", "state": "ended", "code": 42,
                                          "description": "part 7 is obsolete", "actor": "alice", "at": NOW}]
    ended = [r for r in rows(lake, EVENTS) if r["kind"] == "conversation_ended"]
    assert [(e["actor"], e["at"], e["reason"]) for e in ended] == [
        ("alice", NOW, "conversation 'c-1' ended with error 42 (application error): part 7 is obsolete")]
    assert ended_conversations(lake, "q") == {"c-1": (42, "part 7 is obsolete")}
    assert ended_conversations(QueueTables.of(lake, "q")) == {"c-1": (42, "part 7 is obsolete")}


def test_rewritten_files_still_hold_one_batch_each(lake: Declaration) -> None:
    end_conversation(lake, "q", now=NOW, **END)

    for table in ("inbound", "retry_1"):
        actions = pa.table(QueueTables.of(lake, "q").open(table).get_add_actions(flatten=True))
        assert actions.column("min.batch_id").to_pylist() == actions.column("max.batch_id").to_pylist()


def test_rewritten_files_keep_plain_strings_so_filtered_reads_still_work(lake: Declaration) -> None:
    # delta-rs's delete would write string_view columns, and pyarrow cannot filter those.
    end_conversation(lake, "q", now=NOW, **END)

    tables = QueueTables.of(lake, "q")
    for table in tables.waiting:
        for uri in tables.open(table).file_uris():
            assert pa.string_view() not in pq.read_schema(uri).types, (table, uri)
    found = inspect_message(lake, "o-2")
    assert found is not None and [p.table for p in found.locations] == ["retry_1"]
    assert end_conversation(lake, "q", "c-2", 7, "also gone", "alice", now=NOW).removed == {
        "inbound": 1, "retry_1": 1, "poison": 0}


def test_a_cycle_taking_the_batches_meanwhile_makes_the_removal_fail_loudly(
    lake: Declaration, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = conversations._delete_moved

    def cycle_first(writer: QueueWriter, table: str, *args: Any) -> None:
        writer.remove_batches(table, args[-1])  # what a cycle's commit does with the batches it took
        original(writer, table, *args)

    monkeypatch.setattr(conversations, "_delete_moved", cycle_first)
    with pytest.raises(DeltaError, match="concurrent transaction deleted data this operation read"):
        end_conversation(lake, "q", now=NOW, **END)


def test_a_second_call_reports_already_ended_and_writes_nothing(lake: Declaration, hook_calls) -> None:
    end_conversation(lake, "q", now=NOW, **END)
    before = table_versions(lake)

    again = end_conversation(lake, "q", "c-1", -8489, "lifetime expired", "bob", now=NOW + timedelta(days=1))

    assert table_versions(lake) == before
    assert again.already_ended
    # The first end stands: its code, description, actor and time.
    assert (again.code, again.description, again.actor, again.ended_at) == (42, "part 7 is obsolete", "alice", NOW)
    assert again.removed == {"inbound": 0, "retry_1": 0, "poison": 0}
    assert again.notified == ()
    assert (again.hook_ran, again.hook_ran_before) == (False, True)
    assert_fully_ended(lake, hook_calls)


def test_messages_arriving_after_the_end_leave_on_the_next_call(lake: Declaration, hook_calls) -> None:
    end_conversation(lake, "q", now=NOW, **END)
    enqueue(lake, "q", [envelope("m-5", sender="shop"), envelope("m-6", sender="outlet")], now=NOW)

    again = end_conversation(lake, "q", now=NOW, **END)

    assert again.already_ended and again.removed["inbound"] == 2
    assert again.notified == ("outlet",)  # shop was told already
    assert ids(lake, "inbound") == ["n-1", "o-1"]
    assert Counter(r["recipient"] for r in rows(lake, NOTIFICATIONS)) == {"shop": 1, "warehouse": 1, "outlet": 1}
    assert len(hook_calls) == 1


def crash_on_call(monkeypatch: pytest.MonkeyPatch, name: str, call: int) -> None:
    """Make conversations.<name> raise instead of running on its `call`-th call."""
    original = getattr(conversations, name)
    seen = [0]

    def crashing(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == call:
            raise Crash(f"killed in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(conversations, name, crashing)


@pytest.mark.parametrize(("name", "call", "where"), [
    ("_event_once", 1, "after the end is recorded, before its event"),
    ("_delete_moved", 1, "after the append to dead_letter, before the delete from inbound"),
    ("_delete_moved", 2, "after inbound was done, between retry_1's append and delete"),
    ("_move_to_dead_letter", 3, "after inbound and retry_1, before poison"),
    ("_notify_senders", 1, "after every move, before the notifications"),
    ("_clean_up", 1, "after the notifications, before the hook"),
])
def test_a_crash_at_any_step_then_a_rerun_duplicates_nothing(
    lake: Declaration, hook_calls, monkeypatch: pytest.MonkeyPatch, name: str, call: int, where: str
) -> None:
    with monkeypatch.context() as patch:
        crash_on_call(patch, name, call)
        with pytest.raises(Crash):
            end_conversation(lake, "q", now=NOW, **END)

    rerun = end_conversation(lake, "q", now=NOW + timedelta(minutes=1), **END)

    assert rerun.already_ended, where
    assert_fully_ended(lake, hook_calls)
    # The record of the end keeps the first call's time.
    assert rows(lake, CONVERSATIONS)[0]["at"] == NOW


def test_a_rerun_after_a_crash_before_the_delete_also_takes_new_arrivals(
    lake: Declaration, hook_calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        crash_on_call(patch, "_delete_moved", 1)
        with pytest.raises(Crash):
            end_conversation(lake, "q", now=NOW, **END)
    # A new message of c-1 arrives before the rerun: inbound has a new version, so the app
    # transaction alone cannot tell what was appended; the batch ids do.
    enqueue(lake, "q", [envelope("m-5", sender="shop")], now=NOW)

    rerun = end_conversation(lake, "q", now=NOW, **END)

    assert rerun.removed["inbound"] == 3
    assert Counter(r["message_id"] for r in rows(lake, "dead_letter")) == {
        "m-1": 1, "m-2": 1, "m-3": 1, "m-4": 1, "m-5": 1}
    assert ids(lake, "inbound") == ["n-1", "o-1"]


def test_a_crash_between_the_hook_and_its_record_runs_the_hook_again(
    lake: Declaration, hook_calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At least once: the hook returned but nothing says so yet, so the rerun cannot know it ran.
    with monkeypatch.context() as patch:
        crash_on_call(patch, "_event_once", 2)
        with pytest.raises(Crash):
            end_conversation(lake, "q", now=NOW, **END)
    assert len(hook_calls) == 1

    assert end_conversation(lake, "q", now=NOW, **END).hook_ran
    assert len(hook_calls) == 2
    assert events(lake)["conversation_cleanup"] == 1


def test_a_failing_hook_is_reported_the_end_stands_and_a_rerun_retries_it(make_declaration, hook_calls) -> None:
    declaration = declare(make_declaration, FLAKY)
    enqueue(declaration, "q", [envelope("m-1")], now=NOW)
    conversation_hooks.FAILURES_LEFT[0] = 1

    first = end_conversation(declaration, "q", now=NOW, **END)

    assert (first.hook_ran, first.hook_ran_before) == (False, False)
    assert first.hook_error == "poison_pipeline_tests.conversation_hooks.StateStoreDown: cannot drop the state of c-1"
    assert first.removed["inbound"] == 1 and first.notified == ("shop",)
    assert ended_conversations(declaration, "q") == {"c-1": (42, "part 7 is obsolete")}
    failed = [r for r in rows(declaration, EVENTS) if r["kind"] == "conversation_cleanup_failed"]
    assert [(f["actor"], f["reason"]) for f in failed] == [(
        "alice", "clean-up hook poison_pipeline_tests.conversation_hooks:flaky failed for conversation 'c-1': "
                 "poison_pipeline_tests.conversation_hooks.StateStoreDown: cannot drop the state of c-1")]

    second = end_conversation(declaration, "q", now=NOW, **END)
    assert (second.already_ended, second.hook_ran, second.hook_error) == (True, True, None)
    third = end_conversation(declaration, "q", now=NOW, **END)
    assert (third.hook_ran, third.hook_ran_before) == (False, True)
    assert len(hook_calls) == 1


def test_without_a_hook_nothing_runs(make_declaration) -> None:
    declaration = declare(make_declaration, hook=None)
    enqueue(declaration, "q", [envelope("m-1", sender=None)], now=NOW)

    result = end_conversation(declaration, "q", now=NOW, **END)

    assert (result.hook, result.hook_ran, result.hook_ran_before) == (None, False, False)
    assert result.removed["inbound"] == 1
    assert result.notified == ()  # the only message had no sender
    assert rows(declaration, NOTIFICATIONS) == []


def test_a_conversation_with_no_messages_can_be_ended_ahead(make_declaration) -> None:
    declaration = declare(make_declaration)
    result = end_conversation(declaration, "q", now=NOW, **END)
    assert not result.already_ended and result.removed_total == 0
    assert ended_conversations(declaration, "q") == {"c-1": (42, "part 7 is obsolete")}


@pytest.mark.parametrize(("change", "message"), [
    ({"queue": "nope"}, "no queue 'nope' is declared; declared: q"),
    ({"conversation_id": ""}, "conversation_id '': must be non-empty text"),
    ({"code": 0}, "code 0: must be a non-zero integer (positive: application error, negative: system error)"),
    ({"code": True}, "code True: must be a non-zero integer"),
    ({"code": "42"}, "code '42': must be a non-zero integer"),
    ({"code": 2**63}, "code 9223372036854775808: must fit in 64 bits"),
    ({"description": ""}, "description '': must be non-empty text"),
    ({"description": "   "}, "description '   ': must be non-empty text"),
    ({"description": "x" * 3001}, "description: 3001 characters; at most 3000 are allowed"),
    ({"actor": ""}, "actor '': must be non-empty text"),
])
def test_invalid_requests_are_refused_before_anything_is_written(
    make_declaration, change: dict[str, Any], message: str
) -> None:
    declaration = declare(make_declaration)
    request = {"queue": "q", **END, **change}
    with pytest.raises(ConversationError) as error:
        end_conversation(declaration, **request)
    assert str(error.value).startswith(message)
    assert not Path(declaration.lake_root).exists()


def test_the_hook_path_is_validated_at_load() -> None:
    with pytest.raises(DeclarationError) as error:
        parse_declaration({"lake_root": "/tmp/lake", "queues": {
            "q": {"handler": HANDLER, "on_conversation_end": "nowhere.mod:cleanup"}}})
    assert "queues.q.on_conversation_end = 'nowhere.mod:cleanup'" in str(error.value)
    assert "cannot be imported" in str(error.value)


def test_ended_conversations_of_a_new_queue_and_its_arguments(make_declaration) -> None:
    declaration = declare(make_declaration)
    assert ended_conversations(declaration, "q") == {}
    with pytest.raises(ValueError, match="name the queue"):
        ended_conversations(declaration)
    with pytest.raises(ValueError, match="queue 'other' given with the tables of queue 'q'"):
        ended_conversations(QueueTables.of(declaration, "q"), "other")


def test_status_counts_ended_conversations(lake: Declaration) -> None:
    assert queue_status(lake, "q", NOW).ended_conversations == 0
    assert "conversations ended" not in format_status([queue_status(lake, "q", NOW)])
    end_conversation(lake, "q", now=NOW, **END)
    end_conversation(lake, "q", "c-2", -8462, "peer closed", "alice", now=NOW)

    status = queue_status(lake, "q", NOW)

    assert status.ended_conversations == 2
    assert "  conversations ended with an error: 2" in format_status([status])
