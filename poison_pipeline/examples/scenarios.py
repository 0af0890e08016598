"""The demo's Service Broker scenarios: conversations in order, an outage, and a resend."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pyarrow.compute as pc

from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.examples.drive import Driver
from poison_pipeline.examples.generate import (
    account_messages,
    checkout_messages,
    inventory_messages,
    presentation_messages,
)
from poison_pipeline.examples.handlers import app_db
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.conversations import ended_conversations
from poison_pipeline.storage.enqueue import enqueue
from poison_pipeline.storage.tables import ATTEMPTS, NOTIFICATIONS, TRANSMISSION, QueueTables


def _rows(declaration: Declaration, queue: str, table: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    tables = QueueTables.of(declaration, queue)
    if not tables.exists(table):
        return []
    return tables.open(table).to_pyarrow_table(columns=columns).to_pylist()


def _enqueue(declaration: Declaration, queue: str, records: list[dict[str, Any]], received: Counter[str]) -> int:
    """Enqueue, and count what each queue received for the demo's conservation lines."""
    result = enqueue(declaration, queue, records)
    assert not result.refused, result.refused[:3]
    print(f"enqueued {result.accepted} messages to {queue}")
    received[queue] += result.accepted
    return result.accepted


def conversations(declaration: Declaration, driver: Driver, received: Counter[str]) -> bool:
    print("\n== Conversations in order ==")
    accounts = _enqueue(declaration, "accounts", account_messages(500, random.Random(11)), received)
    _enqueue(declaration, "presentations", presentation_messages(20, broken=3), received)
    driver.drive(["accounts", "presentations"])
    attempts = _rows(declaration, "accounts", ATTEMPTS, ["outcome"])
    failed = sum(1 for a in attempts if a["outcome"] != "success")
    print(f"accounts: {accounts} messages, most orders enqueued before their profile; {len(attempts)} attempts, "
          f"{failed} failed: each conversation was handled in sequence order")
    ended = ended_conversations(declaration, "presentations")
    for conversation, (code, description) in ended.items():
        print(f"presentations: {conversation} ended with error {code}: {description}")
    gone = [r["message_id"] for r in _rows(declaration, "presentations", "dead_letter", ["message_id", "reason"])
            if r["reason"] == "conversation_ended"]
    print(f"  its messages left every table, recorded in dead_letter: {', '.join(sorted(gone))}")
    notes = [r for r in _rows(declaration, "presentations", NOTIFICATIONS) if r["kind"] == "conversation_error"]
    for note in notes:
        print(f"  the sender {note['recipient']} was told: error {note['code']}: {note['description'][:70]}...")
    hook = app_db() / "ended" / "presentation-003"
    print(f"  the clean-up hook ran once: {hook} {'exists' if hook.exists() else 'MISSING'}")
    shown = sum(1 for _ in (app_db() / "presentations").glob("presentation-*/slide-*"))
    print(f"  the 19 other presentations were shown in full: {shown} slides")
    return failed == 0 and list(ended) == ["presentation-003"] and len(gone) == 3 and hook.exists() and shown == 95


def outage(declaration: Declaration, driver: Driver, received: Counter[str]) -> bool:
    print("\n== An outage: the inventory database is down ==")
    flag = app_db() / "inventory.down"
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.touch()
    count = _enqueue(declaration, "inventory", inventory_messages(2_000, random.Random(5), prefix="inv-outage"),
                     received)
    driver.drive(["inventory"])
    tables = QueueTables.of(declaration, "inventory")
    state = queue_state(tables)
    print(f"inventory is {'enabled' if state.enabled else 'DISABLED'}: {state.reason}")
    outage_attempts = [a for a in _rows(declaration, "inventory", ATTEMPTS, ["outcome"]) if a["outcome"] == "outage"]
    print(f"  {len(outage_attempts)} attempts failed during the outage and were charged to no message")
    flag.unlink()
    print("the database is back: poison-pipeline enable inventory")
    set_enabled(tables, True, "demo", "the inventory database is back")
    driver.drive(["inventory"])
    outage_ids = pc.starts_with(tables.open("processed").to_pyarrow_table(columns=["message_id"])["message_id"],
                                "inv-outage")
    processed = pc.sum(outage_ids.cast("int64")).as_py() or 0
    print(f"  {processed} of the {count} withdrawals were then processed or moved on; the queue is "
          f"{'enabled' if queue_state(tables).enabled else 'disabled'}")
    return not state.enabled and bool(outage_attempts) and queue_state(tables).enabled and processed > 0


def resend(declaration: Declaration, driver: Driver, received: Counter[str], lifetime_s: float = 4.0) -> bool:
    print("\n== Sending, a lifetime-expired conversation, and a resend ==")
    shipping = QueueTables.of(declaration, "shipping")
    shipping.ensure()
    set_enabled(shipping, False, "demo", "shipping is down for maintenance")
    orders = checkout_messages(20, lifetime_s, recalled=7)
    _enqueue(declaration, "checkout", orders, received)
    driver.drive(["checkout", "shipping"])
    pending = _rows(declaration, "checkout", TRANSMISSION, ["conversation_id"])
    print(f"checkout sent {len(pending)} messages on {len({p['conversation_id'] for p in pending})} conversations; "
          "they wait in its transmission queue while shipping is disabled")
    time.sleep(lifetime_s + 0.5)
    print(f"{lifetime_s:g}s later the conversations' lifetime has run out (error -8489, recoverable):")
    driver.drive(["checkout", "shipping"])
    resent = {p["conversation_id"] for p in _rows(declaration, "checkout", TRANSMISSION, ["conversation_id"])}
    print(f"  the pending messages were resent in order on {len(resent)} new conversations, e.g. {min(resent)}")
    set_enabled(shipping, True, "demo", "maintenance is over")
    print("shipping is back: the transmission queue is offered again")
    driver.drive(["checkout", "shipping"])
    arrived = _rows(declaration, "shipping", "processed", ["message_id", "disposition"])
    poisoned = _rows(declaration, "shipping", "quarantine", ["message_id"])
    expected = sum(len(o["body"]["items"]) + 2 for o in orders)
    received["shipping"] += expected  # begin, the items and end of each shipment
    print(f"shipping took whole batches: {len(arrived)} processed, {len(poisoned)} poisoned and quarantined "
          f"({', '.join(p['message_id'] for p in poisoned)}: the recalled item, found by bisection), "
          f"of {expected} sent")
    return len(resent) == 20 and len(arrived) + len(poisoned) == expected and len(poisoned) == 1
