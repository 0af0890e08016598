"""Arrow schemas of every table; Spark schemas are derived from these, never written twice."""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

ENVELOPE_FIELDS = [
    pa.field("message_id", pa.string()),
    pa.field("conversation_id", pa.string()),
    pa.field("sequence_number", pa.int64()),
    pa.field("message_type", pa.string()),
    pa.field("body", pa.binary()),
    pa.field("encoding", pa.string()),
    pa.field("enqueued_at", TS),
    pa.field("expires_at", TS),
    pa.field("sender", pa.string()),
    pa.field("headers", pa.map_(pa.string(), pa.string())),
]

# A waiting message: the envelope, its counts, when it may next be delivered, the last error, and
# the batch that wrote it (a cycle takes and removes whole batches, so a batch id names a file set).
MESSAGE = pa.schema(
    ENVELOPE_FIELDS
    + [
        pa.field("abort_count", pa.int32()),
        pa.field("total_abort_count", pa.int32()),
        pa.field("move_count", pa.int32()),
        # How many times an operator sent the message back from poison, dead-letter or quarantine.
        pa.field("redrive_count", pa.int32()),
        pa.field("due_at", TS),
        pa.field("entered_at", TS),
        pa.field("batch_id", pa.string()),
        pa.field("last_error_type", pa.string()),
        pa.field("last_error_message", pa.string()),
        pa.field("last_error_stack", pa.string()),
        pa.field("last_error_signature", pa.string()),
    ]
)

DEAD_LETTER = pa.schema(
    list(MESSAGE)
    + [
        pa.field("reason", pa.string()),
        pa.field("from_table", pa.string()),
        pa.field("dead_lettered_at", TS),
    ]
)

QUARANTINE = pa.schema(
    list(MESSAGE)
    + [
        pa.field("reason", pa.string()),
        pa.field("from_table", pa.string()),
        pa.field("quarantined_at", TS),
    ]
)

PROCESSED = pa.schema(
    [
        pa.field("message_id", pa.string()),
        pa.field("conversation_id", pa.string()),
        pa.field("message_type", pa.string()),
        pa.field("disposition", pa.string()),
        pa.field("from_table", pa.string()),
        pa.field("batch_id", pa.string()),
        pa.field("total_abort_count", pa.int32()),
        pa.field("move_count", pa.int32()),
        pa.field("at", TS),
        pa.field("date", pa.string()),
        pa.field("cycle_seq", pa.int64()),
        # xxhash64 of message_id (engine/dedup.py): a cycle's dedup scans this, not every id.
        pa.field("id_hash", pa.int64()),
    ]
)

ATTEMPT_FIELDS = [
    pa.field("attempt", pa.int32()),
    pa.field("started_at", TS),
    pa.field("duration_ms", pa.float64()),
    pa.field("outcome", pa.string()),
    pa.field("error_type", pa.string()),
    pa.field("error_message", pa.string()),
    pa.field("error_stack", pa.string()),
    pa.field("error_signature", pa.string()),
    # The handler's error code (its exception's `code`), which retry rules and `unrecoverable` match.
    pa.field("error_code", pa.string()),
]

ATTEMPTS = pa.schema(
    [
        pa.field("message_id", pa.string()),
        pa.field("table", pa.string()),
        pa.field("cycle", pa.int32()),
        *ATTEMPT_FIELDS,
        # On a message's last attempt of a cycle that moved it to a retry subqueue: the delay its
        # policy computed before that retry cycle (back-off, rules, jitter). Null otherwise.
        pa.field("retry_delay_ms", pa.float64()),
        pa.field("run_id", pa.string()),
        pa.field("cycle_seq", pa.int64()),
        pa.field("date", pa.string()),
    ]
)

EVENTS = pa.schema(
    [
        pa.field("event_id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("at", TS),
        pa.field("actor", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("table", pa.string()),
        # messages_failed events: the cycle's run id and seq, and its failures per table and group (JSON).
        pa.field("run_id", pa.string()),
        pa.field("cycle_seq", pa.int64()),
        pa.field("failures", pa.string()),
    ]
)

NOTIFICATIONS = pa.schema(
    [
        pa.field("notification_id", pa.string()),
        pa.field("recipient", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("conversation_id", pa.string()),
        pa.field("code", pa.int64()),
        pa.field("description", pa.string()),
        pa.field("at", TS),
    ]
)

# Conversations ended with an error (Service Broker's END CONVERSATION WITH ERROR): one row per
# conversation, read by the engine to dead-letter messages of it that arrive later.
CONVERSATIONS = pa.schema(
    [
        pa.field("conversation_id", pa.string()),
        pa.field("state", pa.string()),
        pa.field("code", pa.int64()),
        pa.field("description", pa.string()),
        pa.field("actor", pa.string()),
        pa.field("at", TS),
    ]
)

# A queue's lease (storage/lease.py): one row naming who holds it, or none when it is free.
LEASE = pa.schema([
    pa.field("holder_id", pa.string()),
    pa.field("purpose", pa.string()),
    pa.field("run_id", pa.string()),
    pa.field("host", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("since", TS),
    pa.field("renewed_at", TS),
    pa.field("expires_at", TS),
    # Taking the lease increments it, and every commit its holder makes carries it (storage/writer.py).
    pa.field("epoch", pa.int64()),
])

# The operator actions taken on a queue (redrive, purge, enable, ...): who, when, with what, and the
# Delta versions of the tables each touched before and after, so an action can be undone.
ACTIONS = pa.schema(
    [
        pa.field("action_id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("actor", pa.string()),
        pa.field("at", TS),
        pa.field("arguments", pa.string()),  # JSON
        pa.field("state", pa.string()),  # planned, done, undone
        pa.field("counts", pa.string()),  # JSON
        pa.field("versions", pa.string()),  # JSON: {"queue/table": {"before": v, "after": v}}
        pa.field("run_id", pa.string()),
        pa.field("finished_at", TS),
    ]
)

# Operator edits (`poison-pipeline edit`): one row per edit of a failed message's body or headers,
# keeping the original beside the new, written before the edited message is redriven.
EDITS = pa.schema(
    [
        pa.field("edit_id", pa.string()),  # also the id of its action in the actions ledger
        pa.field("message_id", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("source_table", pa.string()),  # poison, dead_letter or quarantine
        pa.field("source_batch_id", pa.string()),
        pa.field("redrive_id", pa.string()),  # the redrive that sent the edited message back
        pa.field("actor", pa.string()),
        pa.field("at", TS),
        pa.field("encoding", pa.string()),
        pa.field("original_body", pa.binary()),
        pa.field("new_body", pa.binary()),
        pa.field("original_headers", pa.map_(pa.string(), pa.string())),
        pa.field("new_headers", pa.map_(pa.string(), pa.string())),
    ]
)

# The cycle journal of a queue: for each waiting table, the state of its latest cycle (planned,
# staged, done), the batches it took and where it staged its results. Written by the lease holder's
# fenced writer, so a holder paused past its lease cannot roll it back.
JOURNAL = pa.schema([
    pa.field("waiting_table", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("state", pa.string()),
    pa.field("run_id", pa.string()),
    pa.field("started_at", pa.string()),
    pa.field("batches", pa.list_(pa.string())),
    pa.field("staging", pa.string()),
    pa.field("summary", pa.string()),
    pa.field("epoch", pa.int64()),
])

# An operator action's plan (storage/plans.py): the rows a redrive or a purge will move or delete,
# as Arrow IPC streams in parts, and the versions of the tables it read them from.
PLANS = pa.schema([
    pa.field("action_id", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("part", pa.int32()),
    pa.field("rows", pa.binary()),  # an Arrow IPC stream of one part of the plan's rows
    pa.field("versions", pa.string()),  # JSON: {"table": version} as the plan read them
    pa.field("epoch", pa.int64()),
])

# The purged ledger: messages an operator (or a declared retention) deleted for good from poison,
# dead_letter or quarantine. Their bodies are gone; their ids, where they were and which action took
# them stay, so the conservation line counts them as a terminal outcome of their own.
PURGED = pa.schema(
    [
        pa.field("message_id", pa.string()),
        pa.field("conversation_id", pa.string()),
        pa.field("message_type", pa.string()),
        pa.field("from_table", pa.string()),  # poison, dead_letter or quarantine
        pa.field("batch_id", pa.string()),  # the batch it was in there
        pa.field("failed_at", TS),  # when it entered that table
        pa.field("last_error_signature", pa.string()),
        pa.field("failure_group", pa.string()),  # its group id (see `groups`), as --group takes it
        pa.field("purged_at", TS),
        pa.field("action_id", pa.string()),
    ]
)

# A marker per archived failed message (`archive`): the row stays in its table, left out of groups,
# checks and selections while its marker is here; `restore` removes the marker.
ARCHIVED = pa.schema(
    [
        pa.field("message_id", pa.string()),
        pa.field("conversation_id", pa.string()),
        pa.field("message_type", pa.string()),
        pa.field("from_table", pa.string()),  # poison, dead_letter or quarantine: where the row is
        pa.field("batch_id", pa.string()),  # the row's batch there: the marker is that row's only
        pa.field("failed_at", TS),
        pa.field("last_error_signature", pa.string()),
        pa.field("failure_group", pa.string()),
        pa.field("archived_at", TS),
        pa.field("action_id", pa.string()),
    ]
)

# The intake ledger: one row per batch of messages that entered the queue from outside (an enqueue,
# a delivery from another queue's transmission, a send that never left, a redrive from or to another
# queue, negative when they left), so the conservation check knows what was ever accepted.
INTAKE = pa.schema(
    [
        pa.field("batch_id", pa.string()),
        pa.field("source", pa.string()),  # enqueue, sent by <queue>, unsent, redrive ...
        pa.field("messages", pa.int64()),
        pa.field("at", TS),
    ]
)

# The sender's transmission queue: sent messages waiting until their target queue accepts them.
TRANSMISSION = pa.schema(
    [pa.field("target_queue", pa.string())]
    + ENVELOPE_FIELDS
    + [
        pa.field("source_message_id", pa.string()),
        # The end of the conversation's lifetime: still here then, it fails with error -8489.
        pa.field("deadline", TS),
        pa.field("original_conversation_id", pa.string()),
        pa.field("resend_count", pa.int32()),
        # The target's contract when the message was sent (QueueDeclaration.contract).
        pa.field("target_contract", pa.string()),
        pa.field("batch_id", pa.string()),
    ]
)

# What the Spark batch returns per message: the message with its new counts, where it goes and why,
# and every attempt it made in this cycle.
RESULT = pa.schema(
    list(MESSAGE)
    + [
        pa.field("destination", pa.string()),
        pa.field("disposition", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("attempts", pa.list_(pa.struct(ATTEMPT_FIELDS))),
        # What the message's successful attempt sent to other queues, as a JSON list (null: nothing):
        # an internal staging format, a null column costing Spark nothing for the many that send nothing.
        pa.field("sent", pa.binary()),
    ]
)

PARTITIONS: dict[str, list[str]] = {"processed": ["date"], "attempts": ["date"]}
# Tables every cycle commits to (the journal three times): a checkpoint every 10 commits keeps a load to
# it and at most 9 commits (a request each on an object store) instead of up to 99 (delta-rs's default
# interval). Their checkpoints stay small: a few rows, or a file per cycle that maintenance compacts. Not
# the waiting tables: every enqueue commits to inbound, and its checkpoint holds every waiting file. A
# table created before keeps its interval.
CONFIGURATION: dict[str, dict[str, str | None]] = {
    table: {"delta.checkpointInterval": "10"} for table in ("journal", "plans", "actions", "processed", "attempts")}


# The counts and error columns of a message that enters a queue for the first time (a sent message).
FRESH: dict[str, object] = {"abort_count": 0, "total_abort_count": 0, "move_count": 0, "redrive_count": 0,
                            "last_error_type": None,
                            "last_error_message": None, "last_error_stack": None, "last_error_signature": None}


def project(rows: pa.Table, schema: pa.Schema, **constants: object) -> pa.Table:
    """`rows` as a table of `schema`: named columns filled with constants, the rest taken from rows."""
    columns = []
    for field in schema:
        if field.name in constants:
            # Repeated in Arrow, not converted from a Python list as long as the table: with that list
            # the commit of a 1,000,000-message cycle took 1.07 s, with this 0.77 s.
            columns.append(pa.repeat(pa.scalar(constants[field.name], type=field.type), rows.num_rows))
        else:
            columns.append(rows.column(field.name).cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)
