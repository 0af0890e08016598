"""Handlers the tests declare; the body says how the message should behave."""

from __future__ import annotations

import contextlib
import json
import os
import time

from poison_pipeline.domain.envelope import Message


class Unfixable(Exception):  # noqa: N818
    code = "UNFIXABLE"


def scripted(message: Message) -> None:
    """Body keys: `fail` (always raise), `fail_until_attempt` N, `fail_until_cycle` N,
    `unfixable`, `sleep` seconds, `exit` (kill the worker)."""
    body = message.json()
    if body.get("sleep"):
        time.sleep(body["sleep"])
    if body.get("exit"):
        os._exit(3)
    if body.get("unfixable"):
        raise Unfixable("cannot ever work")
    if body.get("fail"):
        raise ValueError(f"message {message.message_id} always fails")
    if message.attempt < body.get("fail_until_attempt", 0):
        raise RuntimeError("deadlock victim")
    if message.cycle < body.get("fail_until_cycle", 0):
        raise LookupError("profile does not exist yet")


def always_fails(message: Message) -> None:
    raise ValueError("poison handler cannot store it either")


def forwarding(message: Message) -> None:
    """Body: `sends`: a list of {to, type, body?} sent on the message's conversation (or `conversation`),
    with `lifetime_s`; then fails if `fail` (so nothing it sent may be released)."""
    from datetime import timedelta

    body = message.json()
    lifetime = timedelta(seconds=body["lifetime_s"]) if body.get("lifetime_s") else None
    for item in body.get("sends", []):
        message.send(item["to"], item["type"], item.get("body"), conversation_id=body.get("conversation"),
                     lifetime=lifetime)
    if body.get("fail"):
        raise ValueError("failed after sending")


def accept(message: Message) -> None:
    """Takes any message, bodyless ones included."""


PRICES = {"SKU-1": 10}


def _parse_payload(text: str) -> object:
    return json.loads(text)  # a malformed payload fails inside the json module, not here


def _price(sku: str) -> int:
    return PRICES[sku]


def two_bugs(message: Message) -> None:
    """Body `payload`: JSON text the handler parses (malformed: one bug); `sku`: priced from a table
    (unknown: another bug)."""
    body = message.json()
    if "payload" in body:
        _parse_payload(body["payload"])
    if "sku" in body:
        _price(body["sku"])


def reads_and_fails(message: Message) -> None:
    """Reads the body every way a handler can (`json()`, `text()`), then fails, whatever the body."""
    with contextlib.suppress(ValueError):  # not JSON, not UTF-8
        message.json()
    with contextlib.suppress(ValueError):
        message.text()
    raise ValueError(f"cannot process {message.message_type}")


def leaves_late_staged_file(message: Message) -> None:
    """Body `staging`: the queue's staging root (`_work/staging`). Writes, into every cycle staging folder there, a
    staged file naming a message that was never sent, as a task of a killed earlier delivery that
    finished late would."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq

    from poison_pipeline.engine.staged import STAGED

    ghost = {"message_id": "ghost", "destination": "processed", "disposition": "processed", "attempts": []}
    for folder in glob.glob(os.path.join(message.json()["staging"], "*", "*")):  # <table>/<seq>-<holder>
        pq.write_table(pa.Table.from_pylist([ghost], schema=STAGED), os.path.join(folder, "part-99999-late.parquet"))
