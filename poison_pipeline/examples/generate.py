"""Messages of the demo: inventory withdrawals and purchase orders with known fates."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any


def inventory_messages(count: int, rng: random.Random, prefix: str = "inv") -> list[dict[str, Any]]:
    """2% withdraw an obsolete part (never succeed), 3% are deadlock victims (succeed on retry)."""
    records = []
    for i in range(count):
        roll = rng.random()
        part = f"OBS-{i % 97:03d}" if roll < 0.02 else f"P-{rng.randrange(10_000):05d}"
        records.append({
            "message_id": f"{prefix}-{i:07d}",
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


def account_messages(users: int, rng: random.Random, orders_first: float = 0.8) -> list[dict[str, Any]]:
    """Each user's conversation: create the profile, then place an order. The messages come in a
    random order, except that for a share `orders_first` of the users (drawn from `rng`) the order
    comes before the profile: handled in order, those orders still succeed at their first attempt."""
    records = []
    for u in range(users):
        conversation = f"account-{u:05d}"
        for sequence, kind in ((1, "create_profile"), (2, "place_order")):
            records.append({"message_id": f"acc-{u:05d}-{sequence}", "message_type": f"accounts.{kind}",
                            "conversation_id": conversation, "sequence_number": sequence,
                            "sender": "signup-service", "body": {"user": f"user-{u:05d}"}})
    rng.shuffle(records)
    slots: dict[str, list[int]] = {}
    for position, record in enumerate(records):
        slots.setdefault(str(record["conversation_id"]), []).append(position)
    for first, second in slots.values():
        order_first = rng.random() < orders_first
        a, b = records[first], records[second]
        if (a["sequence_number"] == 2) != order_first:
            records[first], records[second] = b, a
    return records


def presentation_messages(presentations: int, broken: int) -> list[dict[str, Any]]:
    """Five slides per presentation; slide 3 of presentation `broken` has an invalid media format."""
    records = []
    for p in range(1, presentations + 1):
        for slide in range(5, 0, -1):  # sent last slide first: the order is restored on delivery
            media = "video/x-flash" if (p, slide) == (broken, 3) else "image/png"
            records.append({"message_id": f"pres-{p:03d}-slide-{slide}", "message_type": "presentations.slide",
                            "conversation_id": f"presentation-{p:03d}", "sequence_number": slide,
                            "sender": f"author-{p % 3}", "body": {"slide": slide, "media": media}})
    return records


def checkout_messages(count: int, lifetime_s: float, recalled: int) -> list[dict[str, Any]]:
    """Orders whose shipments checkout sends to shipping; order `recalled` has a recalled item."""
    return [
        {"message_id": f"chk-{i:04d}", "message_type": "checkout.order", "sender": "storefront-1",
         "body": {"order": i, "lifetime_s": lifetime_s,
                  "items": [f"SKU-{i:04d}-{k}" for k in range(2)] + (["RECALLED-77"] if i == recalled else [])}}
        for i in range(count)
    ]
