"""Screening a cycle's messages on both paths, a small batch on the driver and a big one in Spark:
exact dedup against the processed ledger's id hashes (engine/dedup.py), ended conversations and
conversations waiting in another table."""

from __future__ import annotations

import functools
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import functions as F

from poison_pipeline.broker.conversations import end_conversation
from poison_pipeline.domain.routing import PROCESSED
from poison_pipeline.engine import cycle as cycle_module
from poison_pipeline.engine import dedup as dedup_module
from poison_pipeline.engine.id_hashes import id_hash
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage import schemas
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.recording_handlers import read_lines
from poison_pipeline_tests.support import attempts_of, places, queue, rows, seed, send
from poison_pipeline_tests.test_ordering import msg, ordered_queue, put

# Written by the ledger before it kept id hashes.
OLD_PROCESSED = pa.schema([f for f in schemas.PROCESSED if f.name != "id_hash"])


# A cycle delivered without Spark (small_cycles) always probes on the driver: the Spark probe
# needs both a batch above SMALL_BATCH and a Spark delivery.
ON_SPARK = {"small_cycles": {"max_messages": 0}}


@pytest.fixture(params=["driver", "spark"])
def path(request, monkeypatch) -> dict[str, object]:
    """Run each test on both probes; the declaration settings of the probe asked for."""
    if request.param == "spark":
        monkeypatch.setattr(cycle_module, "SMALL_BATCH", 0)
        return ON_SPARK
    return {}


def _ledger_rows(ids: dict[str, str], schema: pa.Schema, **extra: list[object]) -> pa.Table:
    now = datetime.now(UTC)
    data: dict[str, list[object]] = {
        "message_id": list(ids), "disposition": list(ids.values()), "from_table": ["inbound"] * len(ids),
        "batch_id": ["old-batch"] * len(ids), "at": [now] * len(ids), "date": [now.date().isoformat()] * len(ids),
        **extra,
    }
    return pa.Table.from_pydict({f.name: data.get(f.name, [None] * len(ids)) for f in schema}, schema=schema)


def test_processed_ids_and_twins_are_duplicates_and_the_ledger_keeps_sparks_hash(spark, make_declaration, path,
                                                                                 request):
    declaration = make_declaration(queue(), **path)
    # Not the session's cores: the twins job's own partitions (one per core) must not stay behind.
    shuffle_partitions = "3"
    request.addfinalizer(functools.partial(spark.conf.set, "spark.sql.shuffle.partitions",
                                           spark.conf.get("spark.sql.shuffle.partitions")))
    spark.conf.set("spark.sql.shuffle.partitions", shuffle_partitions)
    send(declaration, {"a": {}})
    run_cycle(spark, declaration, "q", "inbound")
    send(declaration, {"a": {}, "b": {}})  # a redelivered copy of a processed message
    send(declaration, {"b": {}})  # the same new message enqueued twice
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts["duplicate"] == 2 and report.counts["processed"] == 1
    assert len(attempts_of(declaration, "a")) == 1 and len(attempts_of(declaration, "b")) == 1
    assert sorted(places(declaration)["b"]) == ["processed:duplicate", "processed:processed"]
    # What the big path cached for its delivery job is released with it: a long-lived session
    # (a Connect server) would otherwise keep every cycle's duplicates.
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
    # The twins job turns the partial aggregation off and sets its shuffle's partitions for itself
    # only: the session's other groupings (few keys over many rows) and shuffles keep theirs.
    assert spark.conf.get("spark.sql.execution.bypassPartialAggregation") == "false"
    assert spark.conf.get("spark.sql.shuffle.partitions") == shuffle_partitions
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    ledger = rows(declaration, PROCESSED)
    assert {r["id_hash"] for r in ledger} == {id_hash("a"), id_hash("b")}
    hashes = spark.createDataFrame([(r["message_id"],) for r in ledger], "m string").selectExpr("xxhash64(m) AS h")
    assert {r["h"] for r in hashes.collect()} == {id_hash("a"), id_hash("b")}


def test_a_ledger_written_before_id_hashes_still_finds_its_ids(spark, make_declaration, path):
    declaration = make_declaration(queue(), **path)
    tables = QueueTables.of(declaration, "q")
    write_deltalake(tables.uri(PROCESSED), _ledger_rows({"old": "processed", "dropped": "dropped"}, OLD_PROCESSED),
                    partition_by=["date"])
    send(declaration, {"old": {}, "dropped": {}, "new": {}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts == {**report.counts, "duplicate": 1, "processed": 2}
    assert attempts_of(declaration, "old") == [] and len(attempts_of(declaration, "dropped")) == 1
    # The ledger now holds files with and without hashes: both are read.
    send(declaration, {"old": {}, "new": {}, "fresh": {}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts == {**report.counts, "duplicate": 2, "processed": 1}
    assert [a["message_id"] for a in attempts_of(declaration, "fresh")] == ["fresh"]


def test_an_id_whose_hash_collides_with_a_processed_one_is_delivered(spark, make_declaration, path):
    declaration = make_declaration(queue(), **path)
    send(declaration, {"a": {}})
    run_cycle(spark, declaration, "q", "inbound")
    tables = QueueTables.of(declaration, "q")
    # Another id with the very hash of "c": a collision, forced.
    seed(tables, PROCESSED, _ledger_rows({"not-c": "processed"}, schemas.PROCESSED, id_hash=[id_hash("c")]))
    send(declaration, {"c": {}, "a": {}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts == {**report.counts, "duplicate": 1, "processed": 1}
    assert len(attempts_of(declaration, "c")) == 1 and len(attempts_of(declaration, "a")) == 1
    assert sorted(places(declaration)["c"]) == ["processed:processed"]


def test_ended_and_blocked_conversations_are_screened_on_both_paths(spark, make_declaration, tmp_path, path):
    declaration = make_declaration(ordered_queue(retry_cycle_delay="1h"), **path)
    log = tmp_path / "deliveries.jsonl"
    put(declaration, [msg("j1", "j", 1, log, fail_until_cycle=1)])
    run_cycle(spark, declaration, "q", "inbound")
    [waiting] = rows(declaration, "retry_1")
    end_conversation(declaration, "q", "e", 7, "cancelled", actor="test")

    put(declaration, [msg("j2", "j", 2, log), msg("e1", "e", 1, log), msg("k1", "k", 1, log)])
    report = run_cycle(spark, declaration, "q", "inbound")

    assert report.counts == {"processed": 1, "moved": 1, "ended": 1, "messages": 3, "attempts": 1}
    joined = {r["message_id"]: r["due_at"] for r in rows(declaration, "retry_1")}
    assert joined == {"j1": waiting["due_at"], "j2": waiting["due_at"]}
    assert [(r["message_id"], r["reason"]) for r in rows(declaration, "dead_letter")] == [("e1", "conversation_ended")]
    assert {line["id"] for line in read_lines(log)} == {"j1", "k1"}


def test_twins_are_confirmed_by_id_when_every_id_hash_collides(spark, make_declaration, monkeypatch):
    # A big batch groups its ids by hash before comparing them: with every hash equal, only the
    # real twins may be marked (b's second copy), never another id sharing the hash.
    monkeypatch.setattr(cycle_module, "SMALL_BATCH", 0)
    monkeypatch.setattr(dedup_module, "_hash_of_id", lambda: F.lit(7).cast("long"))
    declaration = make_declaration(queue(), **ON_SPARK)
    send(declaration, {"a": {}, "b": {}, "c": {}})
    send(declaration, {"b": {}})
    report = run_cycle(spark, declaration, "q", "inbound")
    assert report.counts == {**report.counts, "duplicate": 1, "processed": 3}
    assert sorted(places(declaration)["b"]) == ["processed:duplicate", "processed:processed"]
    assert all(len(attempts_of(declaration, i)) == 1 for i in "abc")
