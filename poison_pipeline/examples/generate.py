"""Messages of the demo: inventory withdrawals and purchase orders with known fates."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any


def inventory_messages(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """2% withdraw an obsolete part (never succeed), 3% are deadlock victims (succeed on retry)."""
    records = []
    for i in range(count):
        roll = rng.random()
        part = f"OBS-{i % 97:03d}" if roll < 0.02 else f"P-{rng.randrange(10_000):05d}"
        records.append({
            "message_id": f"inv-{i:07d}",
            "message_type": "inventory.withdrawal",
            "encoding": "json",
            "sender": f"workstation-{i % 12}",
            "body": {"part": part, "quantity": rng.randint(1, 20), "change_order": "CO-7731",
                     "deadlock": 0.02 <= roll < 0.05},
        })
    return records


def order_messages(count: int, now: datetime, rng: random.Random) -> list[dict[str, Any]]:
    """25% arrive before the user's profile (succeed on a retry cycle), 3% never get one
    (rejected to the sender), 2% expired in transit (dead-letter)."""
    records = []
    for i in range(count):
        roll = rng.random()
        profile = "exists"
        expires = None
        if roll < 0.25:
            profile = "pending"
        elif roll < 0.28:
            profile = "missing"
        elif roll < 0.30:
            expires = (now - timedelta(minutes=1)).isoformat()
        record: dict[str, Any] = {
            "message_id": f"ord-{i:07d}",
            "message_type": "orders.purchase_order",
            "encoding": "json",
            "sender": f"storefront-{i % 5}",
            "body": {"order": i, "user": f"user-{rng.randrange(50_000)}", "profile": profile},
        }
        if expires:
            record["expires_at"] = expires
        records.append(record)
    return records
