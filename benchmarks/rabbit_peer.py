"""The RabbitMQ side of the broker drain benchmark: a private node, a publisher and consumers.

A module of its own because its processes are spawned (the benchmark's own process later holds a
JVM, which must not be forked) and import their targets by name.

The peer is configured as its users would for this workload: a quorum queue with a delivery limit
and a dead-letter exchange into a quorum poison queue; publisher confirms handled asynchronously
with a window of unconfirmed messages (batched, never one round trip per message); consumers with a
prefetch, manual acknowledgements batched with `multiple`, and a negative acknowledgement with
requeue for each failed delivery, which the quorum queue counts towards the delivery limit.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, TypedDict

import bench_handler
import pika
from cycle_throughput import body_of

from poison_pipeline.domain.envelope import Envelope, Message

QUEUE = "bench.orders"
POISON_QUEUE = "bench.poison"
DEAD_LETTER_EXCHANGE = "bench.dlx"
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
INSTALLER = Path(__file__).resolve().parents[1] / "tools" / "install_rabbitmq.sh"
# Unconfirmed publishes in flight: the broker acknowledges them in batches (`multiple`).
CONFIRM_WINDOW = 5_000
PREFETCH = 1_000
ACK_EVERY = 200


@dataclass(frozen=True)
class Node:
    port: int
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    folder: str

    def parameters(self) -> pika.ConnectionParameters:
        return pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0, blocked_connection_timeout=300)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _epmd() -> str:
    found = shutil.which("epmd") or next(iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None)
    return str(found) if found else "epmd"


@contextmanager
def private_node() -> Iterator[Node]:
    """A RabbitMQ node of its own (name, ports, port mapper, data and cookie in a temporary folder),
    stopped and removed on the way out whatever happened."""
    subprocess.run(["bash", str(INSTALLER)], check=True, stdout=subprocess.DEVNULL)
    folder = tempfile.mkdtemp(prefix="rabbit-peer-")
    port, epmd_port = _free_port(), _free_port()
    with open(os.path.join(folder, "rabbitmq.conf"), "w") as conf:
        conf.write(f"listeners.tcp.default = {port}\nloopback_users = none\nlog.file.level = warning\n"
                   "log.console = false\n")
    with open(os.path.join(folder, "enabled_plugins"), "w") as plugins:
        plugins.write("[].\n")
    env = {**os.environ, "HOME": folder, "RABBITMQ_NODENAME": f"pp_bench_{os.getpid()}@localhost",
           "RABBITMQ_NODE_PORT": str(port), "RABBITMQ_DIST_PORT": str(_free_port()),
           "ERL_EPMD_PORT": str(epmd_port), "RABBITMQ_MNESIA_BASE": os.path.join(folder, "mnesia"),
           "RABBITMQ_LOG_BASE": os.path.join(folder, "log"),
           "RABBITMQ_CONFIG_FILE": os.path.join(folder, "rabbitmq.conf"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(folder, "enabled_plugins"),
           "RABBITMQ_PID_FILE": os.path.join(folder, "rabbit.pid")}
    log = open(os.path.join(folder, "server.out"), "wb")  # noqa: SIM115 - closed in the finally below
    process = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=env, stdout=log, stderr=log,
                               start_new_session=True)
    node = Node(port, env, process, folder)
    try:
        _await_startup(node)
        yield node
    finally:
        subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "stop"], env=env, timeout=60, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        # The node started a port mapper on its own port: it outlives the node unless told to stop.
        subprocess.run([_epmd(), "-kill"], env=env, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _await_startup(node: Node, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if node.process.poll() is not None:
            tail = Path(node.folder, "server.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"rabbitmq-server exited with {node.process.returncode}: {tail}")
        try:
            pika.BlockingConnection(node.parameters()).close()
            return
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rabbitmq-server did not accept connections on port {node.port} "
                                   f"within {timeout:.0f} s") from None
            time.sleep(0.5)


def declare(node: Node, delivery_limit: int) -> None:
    """The quorum queue, its dead-letter exchange and the quorum poison queue, all fresh."""
    connection = pika.BlockingConnection(node.parameters())
    channel = connection.channel()
    for queue in (QUEUE, POISON_QUEUE):
        channel.queue_delete(queue)
    channel.exchange_declare(DEAD_LETTER_EXCHANGE, "fanout", durable=True)
    channel.queue_declare(POISON_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_bind(POISON_QUEUE, DEAD_LETTER_EXCHANGE)
    channel.queue_declare(QUEUE, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": delivery_limit,
        "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE})
    connection.close()


def poison_count(channel: Any) -> int:
    return int(channel.queue_declare(POISON_QUEUE, passive=True).method.message_count)


class _Publishing(TypedDict):
    next: int  # the next message to publish
    confirmed: int  # how many the broker confirmed
    started: float  # perf_counter() at `go`


def publish(port: int, messages: int, go: Event, done: Any, ready: Any) -> None:
    """Publish `messages` persistent messages with confirms, at most CONFIRM_WINDOW unconfirmed;
    `done` gets the seconds from `go` to the last confirm. The messages are built before `ready`
    counts this publisher (as the enqueue side's lines are built before its clock starts)."""
    bodies = [body_of(i) for i in range(messages)]
    properties = [pika.BasicProperties(delivery_mode=2, content_type="application/json", type="bench.order",
                                       message_id=f"m-{i:09d}") for i in range(messages)]
    with ready.get_lock():
        ready.value += 1
    parameters = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)
    state: _Publishing = {"next": 0, "confirmed": 0, "started": 0.0}

    def fill(channel: Any) -> None:
        while state["next"] < messages and state["next"] - state["confirmed"] < CONFIRM_WINDOW:
            i = state["next"]
            channel.basic_publish("", QUEUE, bodies[i], properties[i])
            state["next"] += 1

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            raise RuntimeError(f"the broker refused publish {method.delivery_tag}")
        if method.multiple:
            state["confirmed"] = max(state["confirmed"], method.delivery_tag)
        else:
            state["confirmed"] += 1
        if state["confirmed"] >= messages:
            done.value = time.perf_counter() - state["started"]
            connection.close()
        else:
            fill(frame_channel[0])

    frame_channel: list[Any] = []

    def on_channel(channel: Any) -> None:
        frame_channel.append(channel)
        channel.confirm_delivery(on_confirm)
        go.wait()
        state["started"] = time.perf_counter()
        fill(channel)

    connection: pika.SelectConnection = pika.SelectConnection(
        parameters, on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_close_callback=lambda *_: connection.ioloop.stop())
    connection.ioloop.start()


def consume(port: int, ready: Any, stop: Event, handled: Any, failed: Any) -> None:
    """Deliver each message to the benchmark's handler: ack (batched) on success, nack with requeue
    on failure. Counts successes in `handled` and failed deliveries in `failed`."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    unacked, last_ok, ok, bad = 0, None, 0, 0
    now = datetime.now(UTC)
    with ready.get_lock():
        ready.value += 1
    for method, properties, body in channel.consume(QUEUE, inactivity_timeout=0.05):
        if method is None:  # idle: acknowledge what succeeded, publish the counts, maybe stop
            if last_ok is not None:
                channel.basic_ack(last_ok, multiple=True)
                last_ok, unacked = None, 0
            handled.value, failed.value = ok, bad
            if stop.is_set():
                break
            continue
        headers = properties.headers or {}
        attempt = int(headers.get("x-delivery-count", 0)) + 1
        # Built the way the engine builds a message for the handler (bench_handler._envelope).
        envelope = Envelope(message_id=properties.message_id, message_type=properties.type, body=body,
                            encoding="json", enqueued_at=now)
        try:
            bench_handler.handle(Message(envelope, QUEUE, attempt - 1, 0, 0, attempt))
        except Exception:  # noqa: BLE001 - any handler error fails the delivery
            channel.basic_nack(method.delivery_tag, requeue=True)
            bad += 1
            continue
        ok += 1
        last_ok, unacked = method.delivery_tag, unacked + 1
        if unacked >= ACK_EVERY:
            channel.basic_ack(last_ok, multiple=True)
            last_ok, unacked = None, 0
            handled.value, failed.value = ok, bad
    channel.cancel()
    connection.close()
