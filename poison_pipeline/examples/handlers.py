"""Handlers of the demo, after the reference documents' examples.

- inventory: a withdrawal of a part made obsolete by a change order can never succeed (Service
  Broker's poison example); a deadlock victim succeeds on an immediate retry (WCF's
  ReceiveRetryCount case).
- orders: a purchase order that arrives before the user's profile exists succeeds on a later retry
  cycle (WCF's RetryCycleDelay case); one whose profile never comes is rejected to its sender.
"""

from __future__ import annotations

from poison_pipeline.domain.envelope import Message


class PartObsolete(Exception):  # noqa: N818 - domain name, as the application calls it
    code = "PART_OBSOLETE"


class DeadlockVictim(Exception):  # noqa: N818
    code = 1205


class ProfileMissing(Exception):  # noqa: N818
    code = "PROFILE_MISSING"


def withdraw_inventory(message: Message) -> None:
    body = message.json()
    if body["part"].startswith("OBS-"):
        raise PartObsolete(f"part {body['part']} is obsolete (change order {body.get('change_order')})")
    if body.get("deadlock") and message.attempt == 1:
        raise DeadlockVictim("transaction was deadlocked on lock resources and chosen as the victim")
    if body["quantity"] <= 0:
        raise ValueError(f"quantity must be positive, got {body['quantity']}")


def place_order(message: Message) -> None:
    body = message.json()
    # The profile service creates a "pending" profile within one retry_cycle_delay, so the
    # order succeeds on retry cycle 1; a "missing" profile never comes.
    profile = body.get("profile", "exists")
    if profile == "missing" or (profile == "pending" and message.cycle < 1):
        raise ProfileMissing(f"user {body['user']} has no profile yet")
