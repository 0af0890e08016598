"""Reading narrow columns of a table's files without delta-rs's dataset (storage/files.py): the same
rows as delta-rs reads, local lakes given as paths or file URIs, and lookups that open only the
files whose log statistics may hold what is looked up."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from poison_pipeline.domain.alerts import MESSAGES_FAILED
from poison_pipeline.operations.checks import check_one_place, message_ids
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.maintenance import maintain
from poison_pipeline.storage import schemas
from poison_pipeline.storage.column_cache import note_rows, notes_file
from poison_pipeline.storage.control import QUEUE_DISABLED, event_row, queue_state, set_enabled
from poison_pipeline.storage.events import append_events, events_after, events_cache
from poison_pipeline.storage.files import files_dataset, rows_where_in
from poison_pipeline.storage.message_ids import ids_cache, note_ids
from poison_pipeline.storage.tables import EVENTS, QueueTables
from poison_pipeline.storage.writer import queue_writer
from poison_pipeline_tests.support import queue, seed, send


def _failed_event(seq: int) -> pa.Table:
    row = event_row(MESSAGES_FAILED, datetime.now(UTC), "poison_pipeline", f"inbound cycle {seq} poisoned 1",
                    f"m-{seq}", "inbound", run_id="manual", cycle_seq=seq, failures="[]")
    return pa.Table.from_pylist([row], schema=schemas.EVENTS)


@pytest.mark.parametrize("as_uri", [False, True])
def test_message_ids_of_many_appends_are_those_delta_reads(make_declaration, as_uri):
    declaration = make_declaration(queue())
    for part in range(3):
        send(declaration, {f"m{part}-{i}": {} for i in range(4)})
    tables = QueueTables.of(declaration, "q")
    if as_uri:
        tables = QueueTables(f"file://{tables.lake_root}", "q", {}, tables.waiting)
    expected = tables.open("inbound").to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist()
    assert sorted(message_ids(tables, "inbound").to_pylist()) == sorted(expected)
    assert message_ids(tables, "retry_1").to_pylist() == []  # a table not created yet has none


def test_columns_a_file_lacks_read_as_nulls(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    tables = QueueTables.of(declaration, "q")
    actions = pa.table(tables.open("inbound").get_add_actions(flatten=False))
    wider = pa.schema([pa.field("message_id", pa.string()), pa.field("added_later", pa.string())])
    rows = files_dataset(tables.uri("inbound"), {}, actions["path"].to_pylist(), actions["size_bytes"].to_pylist(),
                         wider).to_table().to_pylist()
    assert rows == [{"message_id": "a", "added_later": None}]


def test_a_lookup_opens_only_the_files_whose_statistics_may_hold_it(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    tables = QueueTables.of(declaration, "q")
    for seq in range(3):
        seed(tables, EVENTS, _failed_event(seq))
    assert set_enabled(tables, False, "ops", "database down")
    events = tables.open(EVENTS)
    # The failure events' files are gone from disk: a lookup that opened them would fail.
    removed = 0
    for uri in events.file_uris():
        path = unquote(urlparse(uri).path) if uri.startswith("file:") else uri
        if pq.read_table(path, columns=["kind"])["kind"].to_pylist() == [MESSAGES_FAILED]:
            os.remove(path)
            removed += 1
    assert removed == 3
    found = rows_where_in(tables.uri(EVENTS), {}, tables.open(EVENTS), "kind", [QUEUE_DISABLED], schemas.EVENTS)
    assert found["reason"].to_pylist() == ["database down"]
    state = queue_state(tables)
    assert not state.enabled and state.reason == "database down" and state.actor == "ops"


def test_a_queue_never_disabled_is_enabled_whatever_its_other_events(make_declaration):
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    tables = QueueTables.of(declaration, "q")
    for seq in range(3):
        seed(tables, EVENTS, _failed_event(seq))
    assert queue_state(tables).enabled



def test_a_first_alert_evaluation_takes_the_events_their_writers_noted(make_declaration):
    """Cycles note the events they append: a sensor's first evaluation (no cursor) opens none of
    their files and raises exactly what it raises from the files alone (no notes, no cache: an
    older lake), in the same order; an event nobody noted is read, a replayed append notes nothing."""
    declaration = make_declaration(queue())
    send(declaration, {"a": {}})
    tables = QueueTables.of(declaration, "q")
    with queue_writer(tables, "test") as writer:
        for seq in range(3):
            assert append_events(writer, _failed_event(seq), app_id="cycle-app", version=seq)
        assert not append_events(writer, _failed_event(2), app_id="cycle-app", version=2)
        writer.append(EVENTS, _failed_event(3))  # written without a note (an older version's cycle)
    set_enabled(tables, False, "test", "inventory database down")  # another kind
    noted = [os.path.join(tables.uri(EVENTS), unquote(p)) for p in
             pa.table(tables.open(EVENTS).get_add_actions())["path"].to_pylist()]
    noted = [p for p in noted if pq.read_table(p)["cycle_seq"].to_pylist()[0] in (0, 1, 2)]
    assert len(noted) == 3
    for path in noted:
        os.rename(path, path + ".away")
    first = events_after(tables, None, MESSAGES_FAILED).events
    again = events_after(tables, None, MESSAGES_FAILED).events  # from the cache the first one left
    for path in noted:
        os.rename(path + ".away", path)
    assert [e.cycle_seq for e in first] == [0, 1, 2, 3]
    shutil.rmtree(events_cache(tables, MESSAGES_FAILED))
    assert first == again == events_after(tables, None, MESSAGES_FAILED).events
    assert [e.kind for e in events_after(tables, None, QUEUE_DISABLED).events] == [QUEUE_DISABLED]


def test_one_place_reads_a_file_once_then_follows_the_log(make_declaration, spark):
    """After a first check, a check opens only the files added since (a file already read is not
    opened again: its removal from disk goes unnoticed), drops what the log no longer lists, and
    still finds an id in two tables."""
    declaration = make_declaration(queue())
    for part in range(3):
        send(declaration, {f"m{part}-{i}": {"fail": True} for i in range(4)})
    tables = QueueTables.of(declaration, "q")
    assert check_one_place(tables).passed
    first = pa.table(tables.open("inbound").get_add_actions(flatten=False))["path"].to_pylist()[0]
    moved = os.path.join(tables.uri("inbound"), unquote(first))
    os.rename(moved, moved + ".away")
    send(declaration, {"late": {"fail": True}})
    assert sorted(message_ids(tables, "inbound").to_pylist()) == sorted(
        [f"m{p}-{i}" for p in range(3) for i in range(4)] + ["late"])
    os.rename(moved + ".away", moved)
    # Every message fails twice and moves to retry_1: the inbound's files leave the log.
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["moved"] == 13
    assert message_ids(tables, "inbound").to_pylist() == []
    assert check_one_place(tables).passed
    send(declaration, {"m1-2": {}})  # enqueued again while its first copy waits in retry_1
    outcome = check_one_place(tables)
    assert not outcome.passed
    assert outcome.metadata["sample"] == ["m1-2: inbound, retry_1"]


def _inbound_files(tables: QueueTables) -> list[str]:
    return pa.table(tables.open("inbound").get_add_actions(flatten=False))["path"].to_pylist()


def test_a_check_takes_the_ids_an_enqueue_noted_and_stays_exact_without_them(make_declaration):
    """An enqueue notes the ids of the file it committed: the first check reads no file of those
    enqueues (their files moved away go unnoticed). Notes torn by a crash, changed on disk or naming
    files that are not in the log change nothing, an older version's notes are dropped unread;
    files nobody noted (compacted by maintenance) are read; a lake without notes (an older
    version's) gives the same ids; a message enqueued twice is still found."""
    declaration = make_declaration(queue())
    for part in range(3):
        send(declaration, {f"m{part}-{i}": {} for i in range(4)})
    tables = QueueTables.of(declaration, "q")
    expected = sorted(f"m{p}-{i}" for p in range(3) for i in range(4))
    notes = notes_file(ids_cache(tables, "inbound"))
    with open(notes, "rb") as handle:
        original = handle.read()
    note_ids(tables, "inbound", _inbound_files(tables)[0], pa.array(["false"]))
    note_rows(ids_cache(tables, "inbound"), _inbound_files(tables)[1], pa.table({"message_id": [7]}))  # not ids
    with open(notes, "rb") as handle:
        false = handle.read()[len(original):]
    with open(notes, "wb") as handle:  # ahead of the true notes: changed on disk, of another schema, torn
        handle.write(false.replace(b"false", b"fakes") + false[:len(false) // 2] + original)
    note_ids(tables, "inbound", "part-unknown.parquet", pa.array(["ghost"]))  # a file the log never listed
    with open(ids_cache(tables, "inbound") + ".notes", "w") as handle:  # an older version's notes
        handle.write('{"path": "part-old.parquet", "values": ["old"]}\n')
    paths = [os.path.join(tables.uri("inbound"), unquote(p)) for p in _inbound_files(tables)]
    for path in paths:
        os.rename(path, path + ".away")
    assert sorted(message_ids(tables, "inbound").to_pylist()) == expected
    for path in paths:
        os.rename(path + ".away", path)
    assert not os.path.exists(notes) and not os.path.exists(ids_cache(tables, "inbound") + ".notes")
    # Compaction rewrites the files under new names nobody noted: they are read.
    maintain(declaration, "q", vacuum=False)
    assert len(_inbound_files(tables)) == 1
    assert sorted(message_ids(tables, "inbound").to_pylist()) == expected
    send(declaration, {"m0-1": {}, "late": {}})
    shutil.rmtree(ids_cache(tables, "inbound"))  # no cache: the notes of the last enqueue and a read
    outcome = check_one_place(tables)
    assert outcome.passed  # one table may hold an id twice (a duplicate-to-be)
    assert sorted(message_ids(tables, "inbound").to_pylist()) == sorted([*expected, "late", "m0-1"])
    shutil.rmtree(tables.work_uri("checks"))  # an older lake: neither notes nor cache
    assert sorted(message_ids(tables, "inbound").to_pylist()) == sorted([*expected, "late", "m0-1"])


def test_one_place_is_exact_whatever_its_cache_holds(make_declaration):
    """The check's cache of ids never decides the outcome: files it holds that the log dropped no
    longer count, a segment held twice (two checks racing) counts once, a torn segment is ignored,
    and many segments rewritten as one keep every id: a message in two tables always fails it."""
    declaration = make_declaration(queue())
    tables = QueueTables.of(declaration, "q")
    for part in range(3):
        send(declaration, {f"m{part}-{i}": {} for i in range(3)})
    assert check_one_place(tables).passed
    waiting = tables.open("inbound").to_pyarrow_table()
    batch = waiting.filter(pc.equal(waiting["message_id"], "m0-0"))["batch_id"][0].as_py()
    seed(tables, "retry_1", waiting.filter(pc.equal(waiting["batch_id"], batch)))
    outcome = check_one_place(tables)
    assert not outcome.passed and outcome.metadata["in_two_places"] == 3
    with queue_writer(tables, "test") as writer:
        writer.remove_batches("inbound", [batch])  # the cached file leaves the log
    assert check_one_place(tables).passed
    rest = sorted(f"m{p}-{i}" for p in (1, 2) for i in range(3))
    assert sorted(message_ids(tables, "inbound").to_pylist()) == rest
    cache = ids_cache(tables, "inbound")
    segment = next(n for n in os.listdir(cache) if n.startswith("seg-"))
    shutil.copyfile(os.path.join(cache, segment), os.path.join(cache, "seg-copy.arrow"))
    with open(os.path.join(cache, "seg-torn.arrow"), "wb") as handle:
        handle.write(b"ARROW1\0\0torn")
    send(declaration, {"m0-1": {}})  # enqueued again while its first copy waits in retry_1
    outcome = check_one_place(tables)
    assert not outcome.passed and outcome.metadata["sample"] == ["m0-1: inbound, retry_1"]
    assert outcome.metadata["ids_checked"] == len(rest) + 1 + 3
    for i in range(20):  # a segment per check, rewritten as one when they grow many
        send(declaration, {f"n{i}": {}})
        assert not check_one_place(tables).passed
    assert len(os.listdir(cache)) < 16
    assert sorted(message_ids(tables, "inbound").to_pylist()) == sorted([*rest, "m0-1", *(f"n{i}" for i in range(20))])
