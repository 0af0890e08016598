"""Envelope validation at enqueue: a malformed envelope is refused clearly, the rest go in."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from poison_pipeline.domain.envelope import EnvelopeError, parse_envelope
from poison_pipeline.operations.records import enqueue
from poison_pipeline_tests.support import queue, rows

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"message_type": "t"}, "message_id: required"),
        ({"message_id": "a"}, "message_type: required"),
        ({"message_id": "a", "message_type": "t", "encoding": "yaml"}, "encoding: 'yaml' is not one of"),
        ({"message_id": "a", "message_type": "t", "encoding": "json", "body": "{oops"}, "body: not valid JSON"),
        ({"message_id": "a", "message_type": "t", "encoding": "xml", "body": "<a>"}, "not well-formed XML"),
        ({"message_id": "a", "message_type": "t", "encoding": "text", "body_base64": "/w=="},
         "not valid UTF-8 at byte 0"),
        ({"message_id": "a", "message_type": "t", "encoding": "empty", "body": "x"}, "must have no body"),
        ({"message_id": "a", "message_type": "t", "sequence_number": 1}, "only meaningful with a conversation"),
        ({"message_id": "a", "message_type": "t", "expires_at": "tomorrow"}, "expires_at: 'tomorrow'"),
        ({"message_id": "a", "message_type": "t", "colour": "red"}, "colour: not an envelope field"),
        ({"message_id": "a", "message_type": "t", "headers": {"k": 1}}, "headers: must be"),
        ("just text", "must be a JSON object"),
    ],
)
def test_malformed_envelopes_are_refused_with_the_field(record, message):
    with pytest.raises(EnvelopeError, match=message):
        parse_envelope(record, NOW)


def test_huge_body_is_refused():
    with pytest.raises(EnvelopeError, match="over the queue's limit of 10"):
        parse_envelope({"message_id": "a", "message_type": "t", "encoding": "text", "body": "x" * 11},
                       NOW, max_body_bytes=10)


def test_binary_body_and_time_to_live():
    from datetime import timedelta

    envelope = parse_envelope({"message_id": "a", "message_type": "t", "encoding": "binary",
                               "body_base64": "AP8="}, NOW, time_to_live=timedelta(hours=1))
    assert envelope.body == b"\x00\xff" and envelope.expires_at == NOW + timedelta(hours=1)


def test_enqueue_keeps_the_good_and_reports_the_bad(make_declaration):
    declaration = make_declaration(queue())
    result = enqueue(declaration, "q", [
        '{"message_id": "a", "message_type": "t", "body": {"x": 1}}',
        '{"message_id": "b", "message_type": "t", "encoding": "xml", "body": "<a>"}',
        "not json at all",
        '{"message_id": "a", "message_type": "t"}',
        '{"message_id": "c", "message_type": "t", "encoding": "empty"}',
    ])
    assert result.accepted == 2
    assert [(r.line, r.message_id) for r in result.refused] == [(2, "b"), (3, None), (4, "a")]
    assert "appears twice" in result.refused[2].error and "not valid JSON" in result.refused[1].error
    assert sorted(r["message_id"] for r in rows(declaration, "inbound")) == ["a", "c"]


def test_an_enqueue_onto_a_queue_whose_tables_were_deleted_creates_them_again(make_declaration):
    """An enqueue opens only the tables it writes; when inbound is missing (a fresh lake, or a
    queue folder deleted) it creates every table of the queue, as the first enqueue did."""
    import shutil

    from poison_pipeline.storage.intake import accepted_total
    from poison_pipeline.storage.tables import QueueTables

    declaration = make_declaration(queue())
    tables = QueueTables.of(declaration, "q")
    assert enqueue(declaration, "q", ['{"message_id": "a", "message_type": "t"}']).accepted == 1
    assert all(tables.exists(table) for table in tables.all_tables)
    shutil.rmtree(tables.uri("inbound").rsplit("/", 1)[0])

    assert enqueue(declaration, "q", ['{"message_id": "b", "message_type": "t"}']).accepted == 1
    assert all(tables.exists(table) for table in tables.all_tables)
    assert [r["message_id"] for r in rows(declaration, "inbound")] == ["b"]
    assert accepted_total(tables) == 1


def test_once_a_queue_has_all_its_tables_they_are_not_asked_for_again_nor_one_made_again_empty(
        spark, make_declaration, monkeypatch):
    """Every cycle and command makes sure the queue's tables exist: asking each costs two requests
    on an object store, so a note says they do. A table deleted by hand is then not replaced by an
    empty one (its history gone without a word): the cycle fails, naming it."""
    import shutil

    from deltalake import DeltaTable

    from poison_pipeline.operations.cycle import run_cycle
    from poison_pipeline.storage.tables import QueueTables

    declaration = make_declaration(queue())
    tables = QueueTables.of(declaration, "q")
    assert enqueue(declaration, "q", ['{"message_id": "a", "message_type": "t"}']).accepted == 1

    def asked(*args, **kwargs):
        raise AssertionError("a table was asked whether it exists")

    with monkeypatch.context() as patch:
        patch.setattr(DeltaTable, "is_deltatable", staticmethod(asked))
        tables.ensure()
    shutil.rmtree(tables.uri("processed"))
    with pytest.raises(FileNotFoundError, match=r"q/processed does not exist: .* not made again empty"):
        run_cycle(spark, declaration, "q", "inbound")
    assert not tables.exists("processed")
    assert [r["message_id"] for r in rows(declaration, "inbound")] == ["a"]
