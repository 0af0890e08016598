"""Handlers of the demo, after the reference documents' examples.

- inventory: a withdrawal of a part made obsolete by a change order can never succeed (Service
  Broker's poison example); a deadlock victim succeeds on an immediate retry (WCF's
  ReceiveRetryCount case); while the inventory database is down every withdrawal fails (Service
  Broker's outage that disables the queue).
- orders: a purchase order that arrives before the user's profile exists succeeds on a later retry
  cycle (WCF's RetryCycleDelay case); one whose profile never comes is rejected to its sender.
- accounts: a profile-then-order conversation, handled in order even when the order arrives first.
- presentations: slides of a presentation in order; a slide with an invalid media format ends the
  presentation with an error (Service Broker option C: a presentation without slide 3 is wrong).
- checkout -> shipping: checkout sends a shipment (begin, items, end) to shipping, which handles
  whole batches; a recalled item fails its batch and is found by bisection.

The "application database" the handlers and the clean-up hook use is a folder:
$POISON_PIPELINE_APP_DB, or ./app_db. Message fields are free text (`../../x`, an absolute path,
NUL): a path built from one is either named by a digest of it (a presentation's folder) or joined
with `safe_path`, which refuses a part that would leave the folder (a profile), so a hostile
message fails, and is rejected, instead of writing elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import timedelta
from pathlib import Path

from poison_pipeline.domain.envelope import Message
from poison_pipeline.handlers import batch_handler, safe_path


class PartObsolete(Exception):  # noqa: N818 - domain name, as the application calls it
    code = "PART_OBSOLETE"


class DeadlockVictim(Exception):  # noqa: N818
    code = 1205


class DatabaseUnavailable(ConnectionError):
    """A ConnectionError: the default policy.outage_errors count it toward outage detection."""

    code = 40613


class ProfileMissing(Exception):  # noqa: N818
    code = "PROFILE_MISSING"


class InvalidMediaFormat(Exception):  # noqa: N818
    code = "INVALID_MEDIA"


class UnsupportedUnit(Exception):  # noqa: N818
    """The bug of the operator scene: a release that cannot read quantities counted in boxes."""


class RecalledItem(Exception):  # noqa: N818
    code = "RECALLED"


def app_db() -> Path:
    return Path(os.environ.get("POISON_PIPELINE_APP_DB", "app_db"))


def withdraw_inventory(message: Message) -> None:
    if (app_db() / "inventory.down").exists():
        raise DatabaseUnavailable("the inventory database is not reachable")
    body = message.json()
    if body["part"].startswith("OBS-"):
        raise PartObsolete(f"part {body['part']} is obsolete (change order {body.get('change_order')})")
    if body.get("deadlock") and message.attempt == 1:
        raise DeadlockVictim("transaction was deadlocked on lock resources and chosen as the victim")
    if body.get("unit", "piece") != "piece" and (app_db() / "inventory.unit-bug").exists():
        raise UnsupportedUnit(f"unit {body['unit']!r} is not supported for part {body['part']}")
    if body["quantity"] <= 0:
        raise ValueError(f"quantity must be positive, got {body['quantity']}")


def place_order(message: Message) -> None:
    body = message.json()
    # The profile service creates a "pending" profile within one retry_cycle_delay, so the
    # order succeeds on retry cycle 1; a "missing" profile never comes.
    profile = body.get("profile", "exists")
    if profile == "missing" or (profile == "pending" and message.cycle < 1):
        raise ProfileMissing(f"user {body['user']} has no profile yet")


def account_event(message: Message) -> None:
    """accounts.create_profile creates the profile; accounts.place_order needs it."""
    user = message.json()["user"]
    profile = safe_path(app_db(), "profiles", user)  # UnsafePath (unrecoverable here) for `../../x`
    if message.message_type == "accounts.create_profile":
        profile.parent.mkdir(parents=True, exist_ok=True)
        profile.touch()
    elif not profile.exists():
        raise ProfileMissing(f"user {user} has no profile yet")


def presentation_folder(conversation_id: str) -> Path:
    """Where the slides shown of a presentation are kept: named by a digest of the conversation id."""
    return app_db() / "presentations" / hashlib.sha256(conversation_id.encode()).hexdigest()[:32]


def hook_log() -> Path:
    """One JSON line per call of the clean-up hook."""
    return app_db() / "conversation_hook.log"


def show_slide(message: Message) -> None:
    body = message.json()
    if body["media"] not in ("image/png", "image/jpeg", "video/mp4"):
        raise InvalidMediaFormat(f"slide {body['slide']}: media format {body['media']!r} is not supported")
    shown = presentation_folder(str(message.conversation_id))
    shown.mkdir(parents=True, exist_ok=True)
    (shown / f"slide-{int(body['slide'])}").touch()


def forget_presentation(conversation_id: str, code: int, description: str, queue: str) -> None:
    """Clean-up hook: drop what was kept of an ended presentation, and log the call."""
    for slide in presentation_folder(conversation_id).glob("slide-*"):
        slide.unlink()
    line = json.dumps({"queue": queue, "conversation_id": conversation_id, "code": code})
    hook_log().parent.mkdir(parents=True, exist_ok=True)
    with hook_log().open("a", encoding="utf-8") as log:
        log.write(line + "\n")


def checkout(message: Message) -> None:
    """Sends the shipment of an order as a conversation: begin (no body), one item each, end."""
    body = message.json()
    lifetime = timedelta(seconds=body["lifetime_s"])
    conversation = f"shipment-{body['order']}"
    message.send("shipping", "shipping.begin", conversation_id=conversation, lifetime=lifetime)
    for item in body["items"]:
        message.send("shipping", "shipping.item", {"sku": item}, conversation_id=conversation, lifetime=lifetime)
    message.send("shipping", "shipping.end", conversation_id=conversation, lifetime=lifetime)


@batch_handler(max_messages=100)
def ship_batch(messages: list[Message]) -> None:
    """Books a whole batch at once, like an activation procedure that RECEIVEs many messages; one
    recalled item fails the whole call."""
    for message in messages:
        if message.message_type == "shipping.item" and message.json()["sku"].startswith("RECALLED-"):
            raise RecalledItem(f"item {message.json()['sku']} was recalled")
