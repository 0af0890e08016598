"""The handler of the cycle throughput benchmark, the plain Spark pass it is compared with, and the
machine's limit for the handler's work (`limit_slice`).

Both live in a module of their own (not in the script) because Spark's Python workers import the
handler by name: the script puts this folder on PYTHONPATH before the session starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pyarrow as pa

from poison_pipeline.domain.envelope import Envelope, Message
from poison_pipeline.engine.batch import python_headers, python_timestamps, with_every_column
from poison_pipeline.storage import schemas

HANDLER = "bench_handler:handle"
QUEUE = "bench"
# The plain pass gives the handler the same number of chances as the cycle's policy
# (receive_retry_count 1): a baseline without the retry would do less work and flatter it.
PLAIN_ATTEMPTS = 2

PLAIN_RESULT = pa.schema(
    [
        pa.field("message_id", pa.string()),
        pa.field("ok", pa.bool_()),
        pa.field("attempts", pa.int32()),
        pa.field("error", pa.string()),
    ]
)
ENVELOPE_COLUMNS = [f.name for f in schemas.ENVELOPE_FIELDS]


class PoisonOrder(Exception):  # noqa: N818 - the name the attempts ledger shows
    """The message can never be processed."""


class DeadlockVictim(Exception):  # noqa: N818
    """A transient failure: the same message succeeds when tried again."""


def handle(message: Message) -> None:
    """Decode the body like a real handler would; fail as the body's `kind` says."""
    body = message.json()
    kind = body["kind"]
    if kind == "poison":
        raise PoisonOrder(f"order {body['order_id']} refers to an obsolete part")
    if kind == "transient" and message.attempt == 1:
        raise DeadlockVictim("transaction was deadlocked and chosen as the victim")


def _envelopes(batch: pa.RecordBatch) -> Iterator[Envelope]:
    # Column by column, as the engine converts (engine.batch._Rows): one to_pylist per column, the
    # timestamps as naive values with UTC attached. Converting row by row (to_pylist of the batch)
    # would cost the baseline a dict per row that no hand-written job pays.
    enqueued = python_timestamps(batch.column("enqueued_at"))
    expires = python_timestamps(batch.column("expires_at"))
    headers = python_headers(batch.column("headers"))
    columns = [batch.column(name).to_pylist() for name in _PLAIN_COLUMNS]
    for i, ((message_id, conversation_id, sequence_number, message_type, body, encoding, sender),
            enqueued_at, expires_at) in enumerate(zip(zip(*columns, strict=True), enqueued, expires, strict=True)):
        yield Envelope(message_id, message_type, body or b"", encoding, enqueued_at,  # type: ignore[arg-type]
                       conversation_id, sequence_number, expires_at, sender, dict(headers.get(i, ())))


_PLAIN_COLUMNS = ["message_id", "conversation_id", "sequence_number", "message_type", "body", "encoding", "sender"]


def plain_pass(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """What a hand-written Spark job would do: call the handler, retry once, keep id, ok, error."""
    # The envelope columns left unread as null in every file come back as nulls, as in the engine.
    for batch in map(with_every_column, batches):
        oks: list[bool] = []
        counts: list[int] = []
        errors: list[str | None] = []
        for envelope in _envelopes(batch):
            ok, error, attempt = False, None, 0
            for attempt in range(1, PLAIN_ATTEMPTS + 1):
                try:
                    handle(Message(envelope, QUEUE, attempt - 1, 0, 0, attempt))
                except Exception as failure:  # noqa: BLE001 - any handler error fails the attempt
                    error = f"{type(failure).__name__}: {failure}"
                    continue
                ok = True
                break
            oks.append(ok)
            counts.append(attempt)
            errors.append(error)
        yield pa.RecordBatch.from_arrays(
            [
                batch.column("message_id"),  # passed through: only what the job computes is converted
                pa.array(oks, pa.bool_()),
                pa.array(counts, pa.int32()),
                pa.array(errors, pa.string()),
            ],
            schema=PLAIN_RESULT,
        )


def limit_slice(ids: list[str], bodies: list[bytes], enqueued_at: datetime) -> tuple[int, int]:
    """The handler's work alone over messages already in memory, in one process: an envelope and a
    delivery per attempt (the handler's API), one retry, nothing read or written. (ok, failed)."""
    ok = failed = 0
    for message_id, body in zip(ids, bodies, strict=True):
        envelope = Envelope(message_id, "order", body, "json", enqueued_at)
        for attempt in range(1, PLAIN_ATTEMPTS + 1):
            try:
                handle(Message(envelope, QUEUE, attempt - 1, 0, 0, attempt))
            except Exception:  # noqa: BLE001 - any handler error fails the attempt
                continue
            ok += 1
            break
        else:
            failed += 1
    return ok, failed
