"""Batch handlers (@batch_handler) on real Spark and Delta (SPEC section 6 "Batches"): a failed
batch is bisected so only its poison messages are charged and no successful sub-batch runs twice."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline.domain.declaration import DeclarationError, load_declaration
from poison_pipeline.handlers import batch_handler, batch_size
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline_tests.recording_handlers import read_lines, recording_batch
from poison_pipeline_tests.support import attempts_of, places, rows

BATCH_HANDLER = "poison_pipeline_tests.recording_handlers:recording_batch"


def declare(make_declaration, **policy: Any):
    base = {"receive_retry_count": 1, "max_retry_cycles": 0, "retry_cycle_delay": 0,
            "receive_error_handling": "move"}
    return make_declaration({"q": {"handler": BATCH_HANDLER, "policy": {**base, **policy}}})


def record(log: Path, message_id: str, **body: Any) -> dict[str, Any]:
    return {"message_id": message_id, "message_type": "test", "body": {"log": str(log), **body}}


def test_bisection_charges_only_the_poison_messages_and_never_repeats_a_success(spark, make_declaration, tmp_path):
    assert batch_size(recording_batch) == 8
    declaration = declare(make_declaration)
    log = tmp_path / "calls.jsonl"
    ids = [f"g{i:02d}" for i in range(16)]
    poison = {"g05", "g12"}  # one in each batch of 8
    # One enqueue: one file, one partition, so the batches are g00-g07 and g08-g15.
    result = enqueue(declaration, "q", [record(log, m, poison=m in poison) for m in ids])
    assert not result.refused

    report = run_cycle(spark, declaration, "q", "inbound")

    calls = read_lines(log)
    assert [c["ids"] for c in calls[:1]] == [ids[:8]], "the handler got the messages as one list"
    assert all(len(c["ids"]) <= 8 for c in calls)
    good = [m for m in ids if m not in poison]
    successful = Counter(m for c in calls if c["ok"] for m in c["ids"])
    assert successful == Counter(good), "every good message is in exactly one successful call"
    # Bisection: a failed call is split in halves, and a half that succeeds is not split further.
    assert [c["ids"] for c in calls if c["ok"]] == [
        ids[0:4], ["g04"], ids[6:8], ids[8:12], ["g13"], ids[14:16]]
    for m in poison:
        alone = [c for c in calls if c["ids"] == [m]]
        assert [c["attempts"] for c in alone] == [[1], [2]], "retried alone, receive_retry_count + 1 times"
    assert report.counts == {"processed": 14, "poisoned": 2, "messages": 16, "attempts": 14 + 2 * 2}
    where = places(declaration)
    for m in good:
        assert where[m] == ["processed:processed"], m
        assert [a["outcome"] for a in attempts_of(declaration, m)] == ["success"], m
    for m in poison:
        assert where[m] == ["poison"], m
        assert [a["outcome"] for a in attempts_of(declaration, m)] == ["abort", "abort"], m
    assert {r["message_id"]: r["total_abort_count"] for r in rows(declaration, "poison")} == {"g05": 2, "g12": 2}


def test_a_batch_handler_with_conversation_ordering_is_refused_at_load(tmp_path):
    path = tmp_path / "poison_pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "lake_root": str(tmp_path / "lake"),
        "queues": {"q": {"handler": BATCH_HANDLER, "policy": {"ordering": "conversation"}}},
    }))

    with pytest.raises(DeclarationError) as refused:
        load_declaration(path)

    text = str(refused.value)
    assert BATCH_HANDLER in text and "ordering" in text and "queues.q" in text
    assert "@batch_handler" in text


def test_batch_handler_rejects_a_bad_size():
    with pytest.raises(ValueError, match="max_messages"):
        batch_handler(max_messages=0)


def test_a_message_settled_before_delivery_does_not_shift_the_batch_routes(spark, make_declaration, tmp_path):
    declaration = declare(make_declaration)
    log = tmp_path / "calls.jsonl"
    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    result = enqueue(declaration, "q", [record(log, "g1"), {**record(log, "old"), "expires_at": past},
                                        record(log, "g2")])
    assert not result.refused

    run_cycle(spark, declaration, "q", "inbound")

    assert [c["ids"] for c in read_lines(log)] == [["g1", "g2"]]
    assert places(declaration) == {"g1": ["processed:processed"], "g2": ["processed:processed"],
                                   "old": ["dead_letter"]}
    assert attempts_of(declaration, "old") == []
