"""The demo's scenarios: conversations in order, an outage, a resend (Service Broker), and an
operator who finds a bug's failures, checks them with a dry run and sends them back after the fix.

Every claim a scenario prints is counted from the Delta tables (or the application's own records)
and printed with OK or MISMATCH; a scenario passes when all of its claims hold."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pyarrow.compute as pc

from poison_pipeline.broker.conversations import CONVERSATION_ENDED, CONVERSATION_ERROR, ended_conversations
from poison_pipeline.broker.transmission import LIFETIME_EXPIRED
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.names import ResendName, SentName
from poison_pipeline.domain.routing import DEAD_LETTER, PROCESSED, QUARANTINE
from poison_pipeline.examples.checks import (
    Checks,
    came_out_of_order,
    counts_differ,
    handled_out_of_order,
    hook_calls,
    resent_from,
    wrongly_charged,
)
from poison_pipeline.examples.drive import Driver
from poison_pipeline.examples.generate import (
    account_messages,
    checkout_messages,
    inventory_messages,
    presentation_messages,
)
from poison_pipeline.examples.handlers import app_db, hook_log, presentation_folder
from poison_pipeline.operations.actions import find_action
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.redrive import RedriveRequest, redrive
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.tables import ATTEMPTS, NOTIFICATIONS, TRANSMISSION, QueueTables
from poison_pipeline.text.groups import groups_table
from poison_pipeline.text.redrive import format_ramp, format_redrive
from poison_pipeline.text.render import render


def _rows(declaration: Declaration, queue: str, table: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    tables = QueueTables.of(declaration, queue)
    if not tables.exists(table):
        return []
    return tables.open(table).to_pyarrow_table(columns=columns).to_pylist()


def _waiting(declaration: Declaration, queue: str, columns: list[str]) -> list[dict[str, Any]]:
    """The rows of every waiting table of `queue` (inbound, retry_n, poison)."""
    return [row for table in QueueTables.of(declaration, queue).waiting
            for row in _rows(declaration, queue, table, columns)]


def _enqueue(declaration: Declaration, queue: str, records: list[dict[str, Any]], received: Counter[str]) -> int:
    """Enqueue, and count what each queue received for the demo's conservation lines."""
    result = enqueue(declaration, queue, records)
    assert not result.refused, result.refused[:3]
    print(f"enqueued {result.accepted} messages to {queue}")
    received[queue] += result.accepted
    return result.accepted


def conversations(declaration: Declaration, driver: Driver, received: Counter[str]) -> Checks:
    print("\n== Conversations in order ==")
    checks = Checks()
    accounts = account_messages(500, random.Random(11))
    _enqueue(declaration, "accounts", accounts, received)
    slides = presentation_messages(20, broken=3)
    _enqueue(declaration, "presentations", slides, received)
    driver.drive(["accounts", "presentations"])

    users = {r["conversation_id"] for r in accounts}
    early = came_out_of_order(accounts)  # the order was enqueued before the profile
    checks.claim(f"accounts: {len(early)} of the {len(users)} orders were enqueued before their profile (most)",
                 2 * len(early) > len(users), f"{len(early)} is not most of {len(users)}")
    attempts = _rows(declaration, "accounts", ATTEMPTS, ["message_id", "outcome", "started_at"])
    failed = [a["message_id"] for a in attempts if a["outcome"] != "success"]
    once = counts_differ(Counter(r["message_id"] for r in accounts), Counter(a["message_id"] for a in attempts))
    checks.claim(f"  {len(attempts)} attempts for {len(accounts)} messages, {len(failed)} failed: each message "
                 "succeeded at its first attempt", not once and not failed,
                 f"failed {sorted(failed)[:5]}; attempts per message: {once[:300]}")
    jumbled = handled_out_of_order(attempts, accounts)
    checks.claim(f"  {len(users) - len(jumbled)} of the {len(users)} conversations were handled in sequence order "
                 "(the profile first)", not jumbled, f"out of order: {sorted(jumbled)[:5]}")

    broken = "presentation-003"
    ended = ended_conversations(declaration, "presentations")
    for conversation, (code, description) in ended.items():
        print(f"presentations: {conversation} ended with error {code}: {description}")
    checks.equal(f"  the one presentation ended: {broken}, with error 415",
                 {broken: 415}, {c: code for c, (code, _) in ended.items()})
    dead = _rows(declaration, "presentations", DEAD_LETTER, ["message_id", "conversation_id", "reason"])
    gone = sorted(r["message_id"] for r in dead if r["reason"] == CONVERSATION_ENDED)
    left = sorted(r["message_id"] for r in _waiting(declaration, "presentations", ["message_id", "conversation_id"])
                  if r["conversation_id"] == broken)
    expected_gone = [f"pres-003-slide-{n}" for n in (3, 4, 5)]
    checks.claim(f"  its messages left every table, recorded in dead_letter: {', '.join(gone) or 'none'}",
                 gone == expected_gone and not left, f"dead-lettered {gone}, still waiting {left}")
    notes = [r for r in _rows(declaration, "presentations", NOTIFICATIONS) if r["kind"] == CONVERSATION_ERROR]
    for note in notes:
        print(f"  the sender {note['recipient']} was told: error {note['code']}: {note['description'][:70]}...")
    told = Counter((n["recipient"], n["conversation_id"], n["code"]) for n in notes)
    senders = {r["sender"] for r in slides if r["conversation_id"] == broken}
    checks.equal(f"  {sum(told.values())} conversation_error notification(s), one per sender of {broken}",
                 Counter({(s, broken, 415): 1 for s in senders}), told)
    calls = hook_calls(hook_log())
    checks.claim(f"  the clean-up hook ran once per ended conversation: {sum(calls.values())} call(s) for "
                 f"{len(ended)} ended", not counts_differ(Counter(dict.fromkeys(ended, 1)), calls),
                 counts_differ(Counter(dict.fromkeys(ended, 1)), calls))
    shown = {r["conversation_id"]: sorted(int(p.name.removeprefix("slide-"))
                                          for p in presentation_folder(r["conversation_id"]).glob("slide-*"))
             for r in slides}
    kept = shown.pop(broken)
    checks.equal(f"  and dropped the {broken} slides shown before slide 3: {len(kept)} left", [], kept)
    checks.equal(f"  the {len(shown)} other presentations were shown in full: "
                 f"{sum(len(v) for v in shown.values())} slides", dict.fromkeys(shown, [1, 2, 3, 4, 5]), shown)
    slide_attempts = _rows(declaration, "presentations", ATTEMPTS, ["message_id", "started_at"])
    jumbled = handled_out_of_order(slide_attempts, slides)
    checks.claim(f"  sent last slide first, every presentation was shown in slide order: {len(jumbled)} out of order",
                 not jumbled, f"out of order: {sorted(jumbled)[:5]}")
    return checks


def outage(declaration: Declaration, driver: Driver, received: Counter[str]) -> Checks:
    print("\n== An outage: the inventory database is down ==")
    checks = Checks()
    flag = app_db() / "inventory.down"
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.touch()
    prefix = "inv-outage"
    records = inventory_messages(2_000, random.Random(5), prefix=prefix)
    count = _enqueue(declaration, "inventory", records, received)
    driver.drive(["inventory"])
    tables = QueueTables.of(declaration, "inventory")
    state = queue_state(tables)
    checks.claim(f"inventory is {'enabled' if state.enabled else 'DISABLED'}: {state.reason}",
                 not state.enabled and (state.reason or "").startswith("outage suspected"),
                 "expected disabled by the outage detection")
    threshold = declaration.queue("inventory").policy.outage_threshold
    during = [a for a in _rows(declaration, "inventory", ATTEMPTS, ["message_id", "outcome"])
              if a["message_id"].startswith(prefix)]
    outage_attempts = sum(1 for a in during if a["outcome"] == "outage")
    checks.claim(f"  {outage_attempts} attempts failed during the outage (at least {threshold} in a row), "
                 f"none otherwise", outage_attempts >= max(threshold, 1) and len(during) == outage_attempts,
                 f"{len(during) - outage_attempts} other attempt(s)")
    flag.unlink()
    print("the database is back: poison-pipeline enable inventory")
    set_enabled(tables, True, "demo", "the inventory database is back")
    driver.drive(["inventory"])
    ours = pc.starts_with(pc.field("message_id"), prefix)
    done = {table: tables.open(table).to_pyarrow_dataset().to_table(
                columns=["message_id", "total_abort_count"], filter=ours).to_pylist()
            for table in (PROCESSED, QUARANTINE)}
    obsolete = sorted(r["message_id"] for r in records if r["body"]["part"].startswith("OBS-"))
    usable = sorted(r["message_id"] for r in records if not r["body"]["part"].startswith("OBS-"))
    processed = sorted(r["message_id"] for r in done[PROCESSED])
    quarantined = sorted(r["message_id"] for r in done[QUARANTINE])
    enabled = queue_state(tables).enabled
    checks.claim(f"  {len(processed)} of the {count} withdrawals were then processed and the {len(quarantined)} of an "
                 f"obsolete part quarantined; the queue is {'enabled' if enabled else 'disabled'}",
                 processed == usable and quarantined == obsolete and enabled,
                 f"expected {len(usable)} processed and {len(obsolete)} quarantined, "
                 f"{len(set(usable) - set(processed))} usable not processed, "
                 f"{len(set(obsolete) - set(quarantined))} obsolete not quarantined")
    attempts = [a for a in _rows(declaration, "inventory", ATTEMPTS, ["message_id", "outcome"])
                if a["message_id"].startswith(prefix)]
    charged = wrongly_charged(done[PROCESSED] + done[QUARANTINE], attempts)
    checks.claim(f"  the outage was charged to no message: {len(charged)} abort count(s) differ from the "
                 "failures outside the outage", not charged, f"e.g. {charged[:5]}")
    return checks


def _shipments(orders: list[dict[str, Any]]) -> dict[str, list[tuple[str, str, str | None]]]:
    """What checkout sends per conversation, in order: (message id, message type, sku)."""
    sent = {}
    for order in orders:
        parts = [("shipping.begin", None)] + [("shipping.item", sku) for sku in order["body"]["items"]]
        parts.append(("shipping.end", None))
        sent[f"shipment-{order['body']['order']}"] = [
            (str(SentName("checkout", order["message_id"], n)), kind, sku)
            for n, (kind, sku) in enumerate(parts, start=1)]
    return sent


def _by_conversation(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """message ids per conversation, in sequence order."""
    grouped: dict[str, list[tuple[int, str]]] = {}
    for row in rows:
        grouped.setdefault(row["conversation_id"], []).append((row["sequence_number"], row["message_id"]))
    return {c: [m for _, m in sorted(v)] for c, v in grouped.items()}


def resend(declaration: Declaration, driver: Driver, received: Counter[str], lifetime_s: float = 15.0) -> Checks:
    # The resent conversations get the same lifetime, and it must outlast the Dagster runs between a
    # resend and the next offer (6-8 s on 2 cores, checks included): 4 s expired again every time.
    print("\n== Sending, a lifetime-expired conversation, and a resend ==")
    checks = Checks()
    shipping = QueueTables.of(declaration, "shipping")
    shipping.ensure()
    set_enabled(shipping, False, "demo", "shipping is down for maintenance")
    orders = checkout_messages(20, lifetime_s, recalled=7)
    _enqueue(declaration, "checkout", orders, received)
    shipments = _shipments(orders)
    sent = {c: [m for m, _, _ in parts] for c, parts in shipments.items()}
    total = sum(len(v) for v in sent.values())
    driver.drive(["checkout", "shipping"])
    columns = ["conversation_id", "sequence_number", "message_id", "message_type"]
    pending = _rows(declaration, "checkout", TRANSMISSION, columns)
    arrived = len(_waiting(declaration, "shipping", ["message_id"]) + _rows(declaration, "shipping", PROCESSED))
    checks.claim(f"checkout sent {len(pending)} messages on {len({p['conversation_id'] for p in pending})} "
                 f"conversations; they wait in its transmission queue while shipping is disabled",
                 _by_conversation(pending) == sent and arrived == 0,
                 f"expected {total} on {len(sent)}, in sequence order; {arrived} reached shipping")
    time.sleep(lifetime_s + 0.5)
    print(f"{lifetime_s:g}s later the conversations' lifetime has run out (error {LIFETIME_EXPIRED}, recoverable):")
    driver.drive(["checkout", "shipping"])
    notes = [n for n in _rows(declaration, "checkout", NOTIFICATIONS) if n["kind"] == CONVERSATION_ERROR]
    told = Counter((n["conversation_id"], n["code"]) for n in notes)
    checks.equal(f"  checkout was told of {len(notes)} conversation errors, one per expired conversation",
                 Counter({(c, LIFETIME_EXPIRED): 1 for c in sent}), told)
    ended = ended_conversations(declaration, "checkout")
    checks.equal(f"  {len(ended)} expired conversations ended with error {LIFETIME_EXPIRED}",
                 dict.fromkeys(sent, LIFETIME_EXPIRED), {c: code for c, (code, _) in ended.items()})
    resent = _by_conversation(_rows(declaration, "checkout", TRANSMISSION, columns))
    expected = {str(ResendName(c, 1)): ids for c, ids in sent.items()}
    checks.claim(f"  the pending messages were resent in order on {len(resent)} new conversations, "
                 f"e.g. {min(resent, default='none')}", resent == expected,
                 f"expected {total} on {', '.join(sorted(expected)[:2])}, ... ({len(expected)}); "
                 f"found {sum(len(v) for v in resent.values())} on {', '.join(sorted(resent)[:2])}, ...")
    set_enabled(shipping, True, "demo", "maintenance is over")
    print("shipping is back: the transmission queue is offered again")
    driver.drive(["checkout", "shipping"])
    arrived_rows = _rows(declaration, "shipping", PROCESSED, ["message_id", "conversation_id", "disposition"])
    poisoned = _rows(declaration, "shipping", QUARANTINE, ["message_id", "conversation_id"])
    recalled = sorted(m for parts in shipments.values() for m, _, sku in parts if sku and sku.startswith("RECALLED-"))
    done = sorted(r["message_id"] for r in arrived_rows if r["disposition"] == "processed")
    shipped = sorted(m for ids in sent.values() for m in ids if m not in recalled)
    received["shipping"] += total  # begin, the items and end of each shipment
    checks.claim(f"shipping took whole batches: {len(done)} processed, {len(poisoned)} poisoned and quarantined "
                 f"({', '.join(p['message_id'] for p in poisoned) or 'none'}: the recalled item, found by bisection), "
                 f"of {total} sent", done == shipped and sorted(p["message_id"] for p in poisoned) == recalled,
                 f"expected {len(shipped)} processed and {recalled} quarantined")
    # On a resend of their own shipment: the first, or a later one had a loaded machine let the new
    # conversation's lifetime run out too (never the original conversation).
    on = {r["message_id"]: resent_from(r["conversation_id"]) for r in arrived_rows + poisoned}
    wanted = {m: c for c, ids in sent.items() for m in ids}
    wrong = sorted(m for m in set(on) | set(wanted) if on.get(m) != wanted.get(m))
    waiting = len(_rows(declaration, "checkout", TRANSMISSION, ["message_id"]))
    checks.claim(f"  all {len(on)} arrived on their new conversation, once; {waiting} left in the transmission queue",
                 not wrong and len(on) == len(arrived_rows) + len(poisoned) and waiting == 0,
                 f"{len(wrong)} not on their new conversation (e.g. {wrong[:3]}), "
                 f"{len(arrived_rows) + len(poisoned) - len(on)} twice")
    return checks


def operator(declaration: Declaration, driver: Driver, received: Counter[str]) -> Checks:
    print("\n== An operator at work: a bug's failures found, cut off, checked, and ramped back after the fix ==")
    checks = Checks()
    bug = app_db() / "inventory.unit-bug"
    bug.parent.mkdir(parents=True, exist_ok=True)
    bug.touch()  # a release that cannot read quantities counted in boxes
    prefix = "inv-units"
    records = inventory_messages(600, random.Random(13), prefix=prefix)
    for i, record in enumerate(records):
        if i % 3 == 0:
            record["body"]["unit"] = "box"
    boxes = sorted(r["message_id"] for r in records if r["body"].get("unit") == "box"
                   and not r["body"]["part"].startswith("OBS-"))
    _enqueue(declaration, "inventory", records, received)
    driver.drive(["inventory"])

    print("$ poison-pipeline groups --queue inventory --table quarantine")
    groups = failure_groups(declaration, "inventory", QUARANTINE)
    print(render(groups_table(groups)))
    units = [g for g in groups if (g.error_type or "").endswith("UnsupportedUnit")]
    checks.claim(f"  groups shows the bug as one group of {units[0].count if units else 0} failures (the "
                 f"{len(boxes)} withdrawals in boxes)", len(units) == 1 and units[0].count == len(boxes),
                 f"groups: {[(g.error_type, g.count) for g in units]}")
    if not units:
        return checks
    seen = units[0].as_of  # the group as the operator saw it: its id and the version of quarantine read

    # While the operator looks, more withdrawals in boxes fail the same way: after the snapshot.
    late = inventory_messages(30, random.Random(17), prefix=f"{prefix}-late")
    for record in late:
        record["body"]["unit"] = "box"
    late_boxes = sorted(r["message_id"] for r in late if not r["body"]["part"].startswith("OBS-"))
    _enqueue(declaration, "inventory", late, received)
    driver.drive(["inventory"])

    tables = QueueTables.of(declaration, "inventory")
    before = {t: tables.open(t).version() for t in tables.all_tables if tables.exists(t)}
    print(f"$ poison-pipeline redrive inventory --from quarantine --group {seen} --dry-run")
    [planned] = redrive(declaration, RedriveRequest(queue="inventory", source_tables=[QUARANTINE], group=seen,
                                                    dry_run=True)).results
    print(format_redrive(planned))
    after = {t: tables.open(t).version() for t in tables.all_tables if tables.exists(t)}
    checks.claim(f"  the dry run of the group as seen ({seen}) would move {planned.moved}, not the "
                 f"{len(late_boxes)} that failed since, and changed no table",
                 planned.moved == len(boxes) and before == after, f"would move {planned.moved}; versions changed: "
                 f"{before != after}")

    bug.unlink()
    print(f"the fix is deployed\n$ poison-pipeline redrive inventory --from quarantine --group {seen} "
          "--ramp 1,10,all")
    report = redrive(declaration, RedriveRequest(queue="inventory", source_tables=[QUARANTINE], group=seen,
                                                 ramp=["1", "10", "all"]), ActionContext(actor="demo"))
    assert report.ramp is not None
    print(format_ramp(report.ramp))
    driver.drive(["inventory"])  # each cycle takes a step; after it, the ramp sends the next
    ramp = find_action(tables, report.ramp.ramp_id or "")
    print(f"$ poison-pipeline actions --queue inventory   # {ramp.action_id if ramp else '?'}: "
          f"{ramp.state if ramp else '?'} {ramp.counts if ramp else ''}")
    checks.claim("  the ramp sent 1, then 9, then the rest, each after a cycle took the step before, and completed",
                 ramp is not None and ramp.state == "done" and ramp.counts.get("completed_steps") == 3
                 and ramp.counts.get("sent") == len(boxes), f"ramp: {ramp}")
    ours = pc.starts_with(pc.field("message_id"), prefix)
    processed = Counter(r["message_id"] for r in tables.open(PROCESSED).to_pyarrow_dataset().to_table(
        columns=["message_id"], filter=ours & (pc.field("disposition") == "processed")).to_pylist())
    left = set(tables.open(QUARANTINE).to_pyarrow_dataset().to_table(columns=["message_id"], filter=ours)[
        "message_id"].to_pylist())
    drained = sorted(m for m in boxes if processed[m] == 1)
    checks.claim(f"  {len(drained)} of the {len(boxes)} processed once; the {len(late_boxes)} that failed after the "
                 "snapshot wait in quarantine", drained == boxes and not left & set(boxes)
                 and set(late_boxes) <= left, f"{len(boxes) - len(drained)} not processed once; left {len(left)}")
    return checks
