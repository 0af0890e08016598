"""Draining a queue against RabbitMQ, measured in the same run: ours at least 5x its drain rate and
at least 5x its publish rate.

Workload (both sides): `--messages` messages of 200-byte JSON bodies, 1% poison, 0.5% transient
(fails its first delivery only), each poison message delivered 5 times before it is set aside.

- ours, in a warm Spark session (a warm-up queue runs the same path first): `enqueue` through the
  Python API in `--chunk`-message batches, then the inbound cycle (`receive_retry_count: 4`, no
  retry subqueue, `move`: 5 attempts, then the poison queue), then the poison cycle, whose default
  reader quarantines them. Drain: from the start of enqueue to the end of the poison cycle.
- RabbitMQ (a private node, see rabbit_peer.py): a quorum queue with `x-delivery-limit` 4 (a
  message is dead-lettered after its fifth failed delivery) and a dead-letter exchange into a quorum
  poison queue; one publisher with batched confirms, two consumer processes (prefetch, batched
  acks, nack + requeue on failure) calling the same handler. Drain: from the first publish until
  every good message is acknowledged and every poison message is in the poison queue; consumers
  run while the publisher publishes, as they would.

Both sides build their messages before their clock starts (our JSON lines, RabbitMQ's bodies and
properties): the benchmark's own making of 1,000,000 messages in Python took seconds and is no
part of either transport.

Prints one JSON line (everything else, Spark's and RabbitMQ's logs included, goes to stderr).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import bench_handler  # noqa: E402
import pika  # noqa: E402
import rabbit_peer  # noqa: E402
from cycle_throughput import body_of, emit, kind_of  # noqa: E402

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration  # noqa: E402
from poison_pipeline.domain.routing import POISON, PROCESSED, QUARANTINE  # noqa: E402
from poison_pipeline.engine.session import build_session  # noqa: E402
from poison_pipeline.operations.cycle import run_cycle  # noqa: E402
from poison_pipeline.operations.records import enqueue  # noqa: E402
from poison_pipeline.storage.tables import QueueTables  # noqa: E402

DRAIN_TARGET = 5.0
PUBLISH_TARGET = 5.0
DELIVERIES = 5  # of a poison message before it is set aside, on both sides
WARMUP = "warmup"
POLICY = {"receive_retry_count": DELIVERIES - 1, "max_retry_cycles": 0, "receive_error_handling": "move"}


def expected(messages: int) -> dict[str, int]:
    kinds = [kind_of(i) for i in range(messages)]
    return {kind: kinds.count(kind) for kind in ("ok", "transient", "poison")}


def _line(i: int, prefix: str) -> str:
    # The JSON line a producer hands to `enqueue` (the same as a line of `poison-pipeline enqueue`).
    return f'{{"message_id":"{prefix}-{i:09d}","message_type":"bench.order","body":{body_of(i).decode()}}}'


def drain_ours(spark: Any, declaration: Declaration, queue: str, messages: int, chunk: int) -> dict[str, Any]:
    # Built before the clock starts, as RabbitMQ's publisher builds its messages before it is ready:
    # both sides time the transport, not the benchmark's own making of the messages.
    chunks = [[_line(i, queue) for i in range(first, min(first + chunk, messages))]
              for first in range(0, messages, chunk)]
    started = time.perf_counter()
    for lines in chunks:
        accepted = enqueue(declaration, queue, lines).accepted
        assert accepted == len(lines), f"enqueue refused {len(lines) - accepted} of {len(lines)}"
    enqueued = time.perf_counter()
    inbound = run_cycle(spark, declaration, queue, "inbound", run_id=f"{queue}-inbound")
    cycled = time.perf_counter()
    poison = run_cycle(spark, declaration, queue, POISON, run_id=f"{queue}-poison")
    finished = time.perf_counter()
    tables = QueueTables.of(declaration, queue)
    want = expected(messages)
    counts = {"processed": tables.open(PROCESSED).count(), "quarantined": tables.open(QUARANTINE).count(),
              "poison_left": tables.open(POISON).count()}
    if counts != {"processed": want["ok"] + want["transient"], "quarantined": want["poison"], "poison_left": 0}:
        raise AssertionError(f"{queue}: the drain left {counts}, expected {want}")
    return {"enqueue_s": round(enqueued - started, 2), "inbound_cycle_s": round(cycled - enqueued, 2),
            "poison_cycle_s": round(finished - cycled, 2), "drain_s": round(finished - started, 2),
            "enqueue_msgs_per_s": round(messages / (enqueued - started)),
            "drain_msgs_per_s": round(messages / (finished - started)), "counts": counts,
            "cycle_counts": {"inbound": {k: int(v) for k, v in inbound.counts.items()},
                             "poison": {k: int(v) for k, v in poison.counts.items()}}}


def drain_rabbit(messages: int, timeout: float) -> dict[str, Any]:
    want = expected(messages)
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold a JVM
    with rabbit_peer.private_node() as node:
        rabbit_peer.declare(node, delivery_limit=DELIVERIES - 1)
        go, stop = context.Event(), context.Event()
        ready, published = context.Value("i", 0), context.Value("d", 0.0)
        counters = [(context.Value("q", 0), context.Value("q", 0)) for _ in range(2)]
        workers = [context.Process(target=rabbit_peer.consume, args=(node.port, ready, stop, handled, failed))
                   for handled, failed in counters]
        workers.append(context.Process(target=rabbit_peer.publish, args=(node.port, messages, go, published, ready)))
        for worker in workers:
            worker.start()
        connection = pika.BlockingConnection(node.parameters())
        channel = connection.channel()
        try:
            while ready.value < 3:  # both consumers connected, the publisher's messages built
                time.sleep(0.05)
            started = time.perf_counter()
            go.set()
            deadline = started + timeout
            while True:
                handled = sum(h.value for h, _ in counters)
                if handled == want["ok"] + want["transient"] and rabbit_peer.poison_count(channel) == want["poison"]:
                    break
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"RabbitMQ did not drain {messages} messages in {timeout:.0f} s "
                                       f"({handled} handled, {rabbit_peer.poison_count(channel)} poison)")
                time.sleep(0.02)
            drained = time.perf_counter() - started
        finally:
            stop.set()
            connection.close()
            for worker in workers:
                worker.join(timeout=60)
                if worker.is_alive():
                    worker.kill()
        failed = sum(f.value for _, f in counters)
    publish_s = published.value
    return {"publish_s": round(publish_s, 2), "drain_s": round(drained, 2),
            "publish_msgs_per_s": round(messages / publish_s) if publish_s else None,
            "drain_msgs_per_s": round(messages / drained),
            # Failed deliveries of poison messages, each: 5 says the delivery limit is set as ours.
            "poison_deliveries_each": round((failed - want["transient"]) / want["poison"], 2),
            "consumers": 2, "prefetch": rabbit_peer.PREFETCH, "confirm_window": rabbit_peer.CONFIRM_WINDOW}


def run(workdir: str, messages: int, chunk: int, warmup: int) -> dict[str, Any]:
    load_start = os.getloadavg()
    declaration = parse_declaration({"lake_root": os.path.join(workdir, "lake"), "queues": {
        name: {"handler": bench_handler.HANDLER, "policy": POLICY} for name in (bench_handler.QUEUE, WARMUP)}})
    rabbit = drain_rabbit(messages, timeout=max(300.0, messages / 500))
    spark = build_session(SparkSettings(master="local[*]", app_name="broker_drain",
                                        config={"spark.ui.showConsoleProgress": "false"}))
    spark.sparkContext.setLogLevel("ERROR")
    try:
        drain_ours(spark, declaration, WARMUP, warmup, chunk)  # starts Python workers, warms the JVM
        ours = drain_ours(spark, declaration, bench_handler.QUEUE, messages, chunk)
    finally:
        spark.stop()
    drain_ratio = ours["drain_msgs_per_s"] / rabbit["drain_msgs_per_s"]
    publish_ratio = ours["enqueue_msgs_per_s"] / rabbit["publish_msgs_per_s"]
    return {
        "benchmark": "broker_drain", "messages": messages, "workload": expected(messages),
        "deliveries_before_poison": DELIVERIES, "enqueue_chunk": chunk, "ours": ours, "rabbitmq": rabbit,
        "drain_ratio": round(drain_ratio, 2), "publish_ratio": round(publish_ratio, 2),
        "drain_target": DRAIN_TARGET, "publish_target": PUBLISH_TARGET,
        "within_target": drain_ratio >= DRAIN_TARGET and publish_ratio >= PUBLISH_TARGET,
        "load_avg": {"start": list(load_start), "end": list(os.getloadavg())}, "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=100_000, help="messages per enqueue call")
    parser.add_argument("--warmup", type=int, default=50_000, help="messages of the warm-up drain (ours)")
    parser.add_argument("--quick", action="store_true", help="20,000 messages (CI)")
    parser.add_argument("--workdir", default=None, help="keep the lake here")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.chunk, args.warmup = 20_000, 10_000, 5_000
    return emit(lambda folder: run(folder, args.messages, args.chunk, args.warmup), args.workdir, "broker-drain-")


if __name__ == "__main__":
    sys.exit(main())
