"""The model-based test of "nothing lost, whatever operators do and however long a process pauses":
random sequences of enqueues, cycles, redrives, edits, purges, undos, maintenance (with the clock
moved past a retention at its floor, so that a vacuum deletes files), conversation ends, changes of
the declaration between steps (a queue's max_retry_cycles lowered or raised, its handler changed),
processes killed at a random commit point and holders paused past their lease expiry, over a real
lake of three queues (model_support.py). After every step the invariants below hold.

Invariants, checked after every step (`check`), from the tables and the test's own record:

1. Nothing lost: every message id the test enqueued (and the lake accepted) has at least as many rows
   across every place of every queue as copies were accepted. A place is a waiting table (inbound,
   retry_k, poison: as the product reports them, so a retry_k beyond a lowered max_retry_cycles that
   still holds messages is one while it drains), processed (any disposition: a ledger row),
   dead_letter, quarantine or purged.
2. Exactly one place (per accepted copy): an id has exactly as many rows across all places as copies
   were accepted, and only in queues it could reach (the queue it was enqueued to, or the target of a
   `--to` redrive run while it was in the source's table). A process killed or paused may leave its
   queue half done until the next cycle of that queue completes it (README, crash safety): this one
   is checked for every id whose reachable queues have no interrupted work; it is checked for all
   after `settle`, which runs every queue's cycles and any action still planned.
3. Purged on purpose: every id in a purged ledger was in that table of that queue when a purge of it
   was started (or, when the queue had interrupted actions, which the purge completes first, anywhere
   in that queue).
4. The product's own books agree: each queue's conservation line balances (accounted = accepted in
   its intake ledger), and the sum of what all queues account for equals the copies the test
   enqueued (moves between queues cancel out; a message gone from every queue does not).
5. Side effects: a successful handler call (`ok` in the effects log) is counted per message id
   from drivers that were neither killed nor paused; there are at most as many as copies of the id
   were accepted. The README allows a handler to be called again when the run that called it was
   killed before its cycle committed: calls by killed drivers, and by paused drivers before their
   pause, are not counted. A paused driver, once resumed after another holder took its lease, may
   finish the one attempt in flight: at most one `ok` after its resume.
6. Actions: every action in every ledger is planned, done or undone; after `settle`, none is planned.

The counts of a run (sequences, steps, kills, pauses, violations) are printed at the end (conftest).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from poison_pipeline.operations.maintenance import RetentionTooShort
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests import model_support as ms
from poison_pipeline_tests.fuzz_support import COUNTS, active_profile
from poison_pipeline_tests.s3_support import fresh_root

# Sequences and steps per profile: `ci` (make test) is bounded, `long` (make model) is the proof.
BUDGETS = {"ci": (10, 20), "long": (2000, 30)}
# On the test run's S3 server: 2 sequences of 20 steps, about six minutes on 2 cores (four took
# twelve, twice the local lake's 10 sequences beside it on the other worker).
S3_BUDGET = (2, 20)
FINAL = ("done", "undone", "abandoned")
KINDS = ("never", "always", "fixable")
# Ids an operator may give: the product's own words, and tails an id shares with the ids derived from it.
OPERATOR_WORDS = ("fix", "fence", "inbound", "transmission", "retry_1", "queue_state", "undo", "parked")
ID_TAILS = ("2", "poison", "dead_letter", "redrive", "1", "parked")
# What an operator does, drawn with repeats so that the commands that move messages come often.
OPERATOR = ("redrive", "redrive", "undo", "undo", "repeat", "purge", "edit", "archive", "restore", "ramp")
# What a kill or pause interrupts: operator commands mostly, a cycle sometimes.
INTERRUPTED = ("redrive", "redrive", "undo", "undo", "repeat", "purge", "edit", "archive", "restore", "ramp",
               "cycle")


class Violation(AssertionError):
    pass


class LakeModel(RuleBasedStateMachine):
    # The storage options of an object store to keep the lake on (the run's S3 server), or None for
    # a local folder.
    store: ClassVar[dict[str, str] | None] = None
    # The steps every sequence runs (`run_lake_model`); one that ran fewer (a draw hypothesis gave up
    # on) is not counted as a sequence of the proof.
    length: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="pp-model-"))
        # What the declaration says besides the queues' policies and handlers, kept as it is when
        # a step changes those.
        self.declared: dict[str, Any] = {}
        if self.store is None:
            self.expiry = ms.EXPIRY_SECONDS
            self.past_expiry = ms.PAST_EXPIRY
        else:
            self.expiry = ms.STORE_EXPIRY_SECONDS
            self.declared = {"store": (fresh_root("model"), self.store)}
            self.past_expiry = ms.STORE_EXPIRY_SECONDS * ms.PAST_EXPIRY / ms.EXPIRY_SECONDS
        self.policies = copy.deepcopy(ms.POLICIES)
        self.handlers = {queue: ms.HANDLER for queue in ms.QUEUES}
        self.config = ms.write_declaration(self.folder, self.policies, expiry=self.expiry, **self.declared)
        self.copies: Counter[str] = Counter()
        self.reach: dict[str, set[str]] = defaultdict(set)
        self.purgeable: set[tuple[str, str, str]] = set()  # (queue, table, id) seen before a purge
        self.interrupted: dict[str, set[str]] = defaultdict(set)  # queue -> what a kill or pause left
        self.killed_drivers: set[int] = set()
        self.paused: dict[int, float] = {}  # paused driver -> when it was resumed
        self.counter = 0
        self.ids_used: list[str] = []  # redrive/edit/purge ids given, for reuse
        self.history: list[tuple[str, dict[str, Any]]] = []  # operator commands run, to run again
        self.steps = 0  # the model's steps: the initializing rule makes several
        self.rules_run = 0  # hypothesis's steps, what a sequence's length counts
        self.points_seen: dict[tuple[str, bool], int] = {}  # the most commit points a run of an operation made
        COUNTS["model sequences"] += 1

    def teardown(self) -> None:
        if self.rules_run >= self.length:
            COUNTS["model full-length sequences"] += 1
        try:
            if self.steps:
                self.settle()
        finally:
            ms.forget_tables()
            if os.environ.get("MODEL_KEEP"):  # the lake of a failing sequence, to read after it
                print(f"MODEL_KEEP {self.folder}")
            else:
                shutil.rmtree(self.folder, ignore_errors=True)

    # ------------------------------------------------------------------------------------ helpers

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def step(self, what: str) -> None:
        self.steps += 1
        COUNTS["model steps"] += 1
        COUNTS[f"model step {what}"] += 1

    def run(self, op: str, args: dict[str, Any]) -> str:
        """Run an operation in-process: a refusal or failure is an outcome, the lake is judged."""
        try:
            outcome, labels = ms.run_counted(str(self.config), op, args)
            self.saw_points(op, args, labels)
            self.trace(op, args, outcome)
            return outcome
        except Exception as error:  # noqa: BLE001 - any failure leaves the lake to be judged
            self.trace(op, args, f"FAILED {type(error).__name__}: {error}")
            COUNTS["model operations failed"] += 1
            refused = isinstance(error, RetentionTooShort)  # refused before anything was done
            if op != "enqueue" and not refused:
                # A failure half way is an interruption its queue's next cycle completes.
                for queue in self.queues_of(op, args):
                    self.interrupted[queue].add(f"failed {op}")
            return f"FAILED {type(error).__name__}: {error}"

    def trace(self, op: str, args: dict[str, Any], outcome: str) -> None:
        if os.environ.get("MODEL_TRACE"):  # what each step did, for reading a failing sequence
            print(f"TRACE {op} {json.dumps(args, default=str)[:200]} -> {outcome[:400]}", file=sys.stderr)

    def queues_of(self, op: str, args: dict[str, Any]) -> list[str]:
        if op == "undo":
            return list(ms.QUEUES)
        if op == "edit":
            return [args["queue"]] if args.get("queue") else list(ms.QUEUES)
        found = [args["queue"]]
        if args.get("to"):
            found.append(args["to"])
        return found

    def ids(self, queue: str, table: str) -> list[str]:
        return ms.ids_in(self.config, queue, table)

    def before_move(self, op: str, args: dict[str, Any]) -> None:
        """What the test records before an operation starts: ids that may move or be purged."""
        if op == "redrive" and args.get("to"):
            for message_id in self.takeable(args["queue"], args["source"]):
                if args["queue"] in self.reach[message_id]:
                    self.reach[message_id].add(args["to"])
        if op == "purge":
            for message_id in self.takeable(args["queue"], args["table"]):
                self.purgeable.add((args["queue"], args["table"], message_id))

    def takeable(self, queue: str, table: str) -> list[str]:
        """The ids an operator command on `table` may take. It completes its queue's interrupted
        actions first: an undo among them may bring back into the table any message of the queue, or
        one its redrive sent to another queue (`--to`): then any message that can reach this queue."""
        if any(a.state == "planned" and a.queue == queue for a in ms.actions(self.config)):
            return [m for m in ms.places(self.config) if queue in self.reach[m]]
        return self.ids(queue, table)

    def cycle_done(self, queue: str, table: str, outcome: str) -> None:
        if outcome.startswith("FAILED"):
            return
        self.interrupted[queue].discard(f"cycle {table}")
        # An action of another queue into this one (a redrive `--to`, or the undo of one) is
        # completed by that queue: until then this queue's books may read it in transit.
        found = ms.actions(self.config)
        by_id = {a.action_id: a for a in found}

        def touches(action: Any) -> bool:
            if queue in (action.queue, action.arguments.get("to")):
                return True
            undone = by_id.get(action.arguments.get("action_id")) if action.kind == "undo" else None
            return undone is not None and queue in (undone.queue, undone.arguments.get("to"))

        if not any(a.state == "planned" and touches(a) for a in found):
            self.interrupted[queue] = {w for w in self.interrupted[queue] if w.startswith("cycle ")}

    # -------------------------------------------------------------------------------------- rules

    @initialize(queues=st.lists(st.sampled_from(ms.QUEUES), min_size=1, max_size=3, unique=True),
                kinds=st.lists(st.sampled_from(("always", "always", "fixable", "never")), min_size=2, max_size=4))
    def failures_first(self, queues: list[str], kinds: list[str]) -> None:
        """Start where operator commands matter: failed messages in poison or dead_letter."""
        for queue in queues:
            self.enqueue(queue, kinds, False, None)
            for table in self.waiting(queue)[:-1]:
                self.cycle(queue, self.waiting(queue).index(table))

    @rule(queue=st.sampled_from(ms.QUEUES), kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=3),
          duplicate=st.booleans(), conversation=st.sampled_from([None, None, "c1", "c2"]))
    def enqueue(self, queue: str, kinds: list[str], duplicate: bool, conversation: str | None) -> None:
        self.step("enqueue")
        new = [self.fresh("m") for _ in kinds]
        lines = [ms.lines_for(self.folder, [m], kind, conversation)[0] for m, kind in zip(new, kinds, strict=True)]
        if duplicate and self.copies:
            again = sorted(self.copies)[self.counter % len(self.copies)]
            lines.append(ms.lines_for(self.folder, [again], "never", conversation)[0])
        outcome = self.run("enqueue", {"queue": queue, "lines": lines})
        if outcome.startswith("FAILED"):
            return
        refused = Counter(json.loads(outcome)["refused"])
        for line in lines:
            if refused[line["message_id"]]:
                refused[line["message_id"]] -= 1
                continue
            self.copies[line["message_id"]] += 1
            self.reach[line["message_id"]].add(queue)

    @rule(queue=st.sampled_from(ms.QUEUES), which=st.integers(0, 4))
    def cycle(self, queue: str, which: int) -> None:
        self.step("cycle")
        table = self.waiting(queue)[which % len(self.waiting(queue))]
        if table.startswith("retry_") and int(table.removeprefix("retry_")) > self.policies[queue]["max_retry_cycles"]:
            COUNTS["model cycles of a draining retry table"] += 1
        self.cycle_done(queue, table, self.run("cycle", {"queue": queue, "table": table}))

    # Cycles are most of what a queue does: another rule, so that they are drawn more often.
    @rule(queue=st.sampled_from(ms.QUEUES))
    def inbound_cycle(self, queue: str) -> None:
        self.cycle(queue, 0)

    def waiting(self, queue: str) -> list[str]:
        """The waiting tables the product reports: the policy's, and a retry_k beyond a lowered
        max_retry_cycles while it still holds messages (it drains; the policy alone would leave
        its messages uncycled)."""
        return list(QueueTables.of(ms.declaration_of(self.config), queue).waiting)

    @rule(queue=st.sampled_from(ms.QUEUES), cycles=st.integers(0, 3), handler=st.sampled_from(ms.HANDLERS))
    def change_declaration(self, queue: str, cycles: int, handler: str) -> None:
        """Rewrite the declaration with `queue`'s max_retry_cycles and handler changed, everything
        else as it was: a lowered count leaves messages in a retry_k beyond it, a raised one adds
        tables, a changed handler takes the waiting messages at their next cycle."""
        self.declare(queue, cycles, handler)

    # A lowered count is what leaves a retry table draining: a rule of its own, the queue with the
    # most retry tables, lowered while failed messages wait in its last one (enqueued and cycled
    # there first), so that the draining table's next cycle comes in every sequence that draws it.
    @rule(handler=st.sampled_from(ms.HANDLERS))
    def lower_retry_cycles(self, handler: str) -> None:
        queue = max(ms.QUEUES, key=lambda q: (self.policies[q]["max_retry_cycles"], q))
        cycles = self.policies[queue]["max_retry_cycles"]
        if cycles:
            self.enqueue(queue, ["always", "fixable"], False, None)
            for which in range(cycles):  # inbound, retry_1 .. retry_(cycles-1): into the last one
                self.cycle(queue, which)
        self.declare(queue, max(0, cycles - 1), handler)

    def declare(self, queue: str, cycles: int, handler: str) -> None:
        self.step("change declaration")
        policy = self.policies[queue]
        COUNTS["model declaration " + ("lowers" if cycles < policy["max_retry_cycles"] else
                                       "raises" if cycles > policy["max_retry_cycles"] else "keeps")
               + " max_retry_cycles"] += 1
        if handler != self.handlers[queue]:
            COUNTS["model declaration changes the handler"] += 1
        policy["max_retry_cycles"] = cycles
        if cycles:
            # Due at once, so that settling carries a message through every retry table.
            policy.setdefault("retry_cycle_delay", "0s")
        self.handlers[queue] = handler
        before = os.stat(self.config).st_mtime_ns
        ms.write_declaration(self.folder, self.policies, expiry=self.expiry, handlers=self.handlers,
                             **self.declared)
        # The declaration is parsed again when its file's time changes: a rewrite within the
        # file system's clock tick must still read as a change.
        if os.stat(self.config).st_mtime_ns <= before:
            os.utime(self.config, ns=(before + 1_000_000, before + 1_000_000))
        self.trace("declare", {"queue": queue, "max_retry_cycles": cycles, "handler": handler},
                   f"waiting {self.waiting(queue)}")

    @rule()
    def fix_or_break(self) -> None:
        self.step("fix")
        flag = self.folder / "fixed"
        if flag.exists():
            flag.unlink()
        else:
            flag.touch()

    def failure_place(self, data: st.DataObject) -> tuple[str, str]:
        """A (queue, failure table) that holds messages, mostly; any one sometimes."""
        held = sorted({(q, t) for where in ms.places(self.config).values() for q, t in where
                       if t in ms.FAILURE_TABLES})
        if held and data.draw(st.integers(0, 3)):
            return data.draw(st.sampled_from(held))
        return data.draw(st.sampled_from(ms.QUEUES)), data.draw(st.sampled_from(ms.FAILURE_TABLES))

    def redrive_args(self, data: st.DataObject) -> dict[str, Any]:
        queue, source = self.failure_place(data)
        args: dict[str, Any] = {"queue": queue, "source": source}
        there = self.ids(queue, source)
        how = data.draw(st.sampled_from(["all", "all", "ids", "group"]))
        if how == "ids" and there:
            args["selection"] = {"ids": data.draw(st.lists(st.sampled_from(there), min_size=1, unique=True))}
        elif how == "group":
            from poison_pipeline.operations.groups import failure_groups
            groups = failure_groups(ms.declaration_of(self.config), queue, source)
            if groups:
                args["selection"] = {"group": data.draw(st.sampled_from([g.id for g in groups]))}
        if not data.draw(st.integers(0, 2)):
            args["to"] = data.draw(st.sampled_from([q for q in ms.QUEUES if q != queue]))
        args["id"] = self.choose_id(data, "r")
        return args

    def choose_id(self, data: st.DataObject, prefix: str) -> str | None:
        how = data.draw(st.sampled_from(["default", "default", "fresh", "like", "reused"]))
        if how == "default":
            return None
        if how == "reused" and self.ids_used:
            return data.draw(st.sampled_from(self.ids_used))
        if how == "like":
            # As an operator names things: an id sharing a prefix and separators with one given
            # before or with the ids the product derives (fix, fix-2, fix-poison, fix-redrive), or
            # one of the product's own words.
            base = data.draw(st.sampled_from([*self.ids_used, *OPERATOR_WORDS]))
            chosen = data.draw(st.sampled_from([base, *(f"{base}-{tail}" for tail in ID_TAILS)]))
            if chosen not in self.ids_used:
                self.ids_used.append(chosen)
            return chosen
        chosen = self.fresh(prefix)
        self.ids_used.append(chosen)
        return chosen

    def failed_ids(self) -> list[tuple[str, str]]:
        return sorted({(q, m) for m, where in ms.places(self.config).items() for q, t in where
                       if t in ms.FAILURE_TABLES})

    def edit_args(self, data: st.DataObject, fail: str | None = None) -> dict[str, Any] | None:
        failed = self.failed_ids()
        if not failed:
            return None
        queue, message_id = data.draw(st.sampled_from(failed))
        chosen = fail if fail is not None else data.draw(st.sampled_from(KINDS))
        return {"message_id": message_id, "queue": queue, "id": self.choose_id(data, "e"),
                "body": json.dumps(ms.body_of(self.folder, chosen))}

    def purge_args(self, data: st.DataObject) -> dict[str, Any]:
        queue, table = self.failure_place(data)
        args: dict[str, Any] = {"queue": queue, "table": table, "older_than": 0, "id": self.choose_id(data, "p")}
        there = self.ids(queue, table)
        if there and data.draw(st.booleans()):
            args["selection"] = {"ids": data.draw(st.lists(st.sampled_from(there), min_size=1, unique=True))}
        return args

    def archive_args(self, data: st.DataObject) -> dict[str, Any]:
        """An archive or a restore: a failure table's messages, all or some of them."""
        queue, table = self.failure_place(data)
        args: dict[str, Any] = {"queue": queue, "table": table, "id": self.choose_id(data, "a")}
        there = self.ids(queue, table)
        if there and data.draw(st.booleans()):
            args["selection"] = {"ids": data.draw(st.lists(st.sampled_from(there), min_size=1, unique=True))}
        return args

    def undo_args(self, data: st.DataObject) -> dict[str, Any] | None:
        recorded = [(a.action_id, a.queue) for a in ms.actions(self.config)]  # oldest first
        if not recorded:
            return None
        # The latest action most often: an operator undoes what they just did.
        action_id, queue = data.draw(st.sampled_from([*recorded, recorded[-1], recorded[-1]]))
        return {"id": action_id, "queue": queue}

    def repeat_args(self, data: st.DataObject) -> tuple[str, dict[str, Any]] | None:
        """An operator command run before, with the same arguments (and id, or none), the latest most often."""
        if not self.history:
            return None
        return data.draw(st.sampled_from([*self.history, self.history[-1]]))

    def operator_args(self, data: st.DataObject, choices: tuple[str, ...]) -> tuple[str, dict[str, Any]] | None:
        op = data.draw(st.sampled_from(choices))
        if op == "repeat":
            return self.repeat_args(data)
        if op == "cycle":
            queue = data.draw(st.sampled_from(ms.QUEUES))
            return op, {"queue": queue, "table": data.draw(st.sampled_from(self.waiting(queue))), "run_id": "child"}
        if op == "redrive":
            return op, self.redrive_args(data)
        if op == "purge":
            return op, self.purge_args(data)
        if op in ("archive", "restore"):
            return op, self.archive_args(data)
        if op == "ramp":
            queue, source = self.failure_place(data)
            steps = data.draw(st.sampled_from([["1", "all"], ["1", "2", "all"], ["2", "3"]]))
            return op, {"queue": queue, "source": source, "steps": steps,
                        "max_failures": data.draw(st.integers(0, 1)), "id": self.choose_id(data, "m")}
        if op == "edit":
            args = self.edit_args(data, "never" if choices is INTERRUPTED else None)
            return None if args is None else (op, args)
        args = self.undo_args(data)
        return None if args is None else (op, args)

    def operate(self, data: st.DataObject) -> None:
        """An operator command (redrive, undo, purge, edit, or one run before), run in-process."""
        chosen = self.operator_args(data, OPERATOR)
        if chosen is None:
            self.step("operator (nothing to do)")
            return
        op, args = chosen
        self.step(op)
        self.before_move(op, args)
        self.history.append((op, args))
        COUNTS[f"model operator {op} outcome {self.run(op, args).split(' ')[0]}"] += 1

    # Operator commands are what loses messages: several rules draw them, so they come often.
    @rule(data=st.data())
    def operator(self, data: st.DataObject) -> None:
        self.operate(data)

    @rule(data=st.data())
    def operator_again(self, data: st.DataObject) -> None:
        self.operate(data)

    @rule(data=st.data())
    def operator_once_more(self, data: st.DataObject) -> None:
        self.operate(data)

    @rule(data=st.data())
    def operator_yet_again(self, data: st.DataObject) -> None:
        self.operate(data)

    @rule(queue=st.sampled_from(ms.QUEUES), vacuum=st.booleans())
    def maintain(self, queue: str, vacuum: bool) -> None:
        self.step("maintain")
        self.run("maintain", {"queue": queue, "vacuum": vacuum})

    @rule(queue=st.sampled_from(ms.QUEUES), retention=st.sampled_from(["floor", "floor", "zero"]))
    def maintain_past_retention(self, queue: str, retention: str) -> None:
        """A vacuum with the clock moved past its retention: every removal dated hours back, the
        retention at its floor (the lease expiry), so that the vacuum deletes every file no kept
        version reads; an undo after it must still find the versions its action recorded. A
        retention of 0 is below the floor: refused, nothing done."""
        self.step("maintain past retention")
        if retention == "zero":
            outcome = self.run("maintain", {"queue": queue, "vacuum": True, "retention": 0})
            self.require(outcome.startswith("FAILED RetentionTooShort"),
                         f"a vacuum with a retention of 0 was not refused: {outcome}")
            return
        # Twice: the second vacuum deletes the files the first one's compaction removed too.
        for _ in range(2):
            if self.store is None:  # the removals of a lake on a store are not files here to date back
                ms.age_removals(self.folder, queue, hours=3)
            outcome = self.run("maintain", {"queue": queue, "vacuum": True, "retention": self.expiry})
            if outcome.startswith("maintained vacuumed "):
                COUNTS["model files vacuumed past retention"] += int(outcome.rsplit(" ", 1)[1])

    @rule(queue=st.sampled_from(ms.QUEUES), conversation=st.sampled_from(["c1", "c2"]))
    def end_conversation(self, queue: str, conversation: str) -> None:
        self.step("end conversation")
        self.run("end", {"queue": queue, "conversation": conversation})

    def mark_interrupted(self, op: str, args: dict[str, Any]) -> None:
        for queue in self.queues_of(op, args) if op != "cycle" else [args["queue"]]:
            self.interrupted[queue].add(f"cycle {args['table']}" if op == "cycle" else f"interrupted {op}")

    def point_key(self, op: str, args: dict[str, Any]) -> tuple[str, bool]:
        return op, bool(args.get("to"))

    def saw_points(self, op: str, args: dict[str, Any], labels: list[str] | None) -> None:
        key = self.point_key(op, args)
        self.points_seen[key] = max(self.points_seen.get(key, 0), len(labels or []))

    def commit_point(self, data: st.DataObject, op: str, args: dict[str, Any]) -> int:
        """One of the commit points `op` may make: of as many as the most a run of it made in this
        sequence (counted as the model runs operations in-process), or its usual count before one ran.
        A point beyond what this run makes lets it end by itself."""
        most = max(self.points_seen.get(self.point_key(op, args), 0), ms.USUAL_POINTS[op])
        # A fraction, not integers(1, n): n grows during a sequence, and a replay needs the same draw.
        return 1 + data.draw(st.integers(0, 999)) * most // 1000

    def interrupt(self, data: st.DataObject, mode: str) -> None:
        """Run an operation in a child stopped at one of its commit points: killed (SIGKILL) right
        after it, or paused (SIGSTOP) right before it past its lease expiry while a cycle of the same
        queue takes the lease over, then resumed."""
        self.step(mode)
        chosen = self.operator_args(data, INTERRUPTED)
        if chosen is None:
            COUNTS[f"model {mode} with nothing to do"] += 1
            return
        op, args = chosen
        at = self.commit_point(data, op, args)
        COUNTS[f"model {mode} of {op}"] += 1
        self.before_move(op, args)
        if op != "cycle":
            self.history.append((op, args))
        if mode == "kill":
            self.kill_at(op, args, at)
        else:
            self.pause_at(op, args, at)

    def kill_at(self, op: str, args: dict[str, Any], at: int) -> None:
        child = ms.start_child(self.config, op, args, "kill", at)
        child.finish()
        self.trace(f"kill@{at} {op}", args, " | ".join(child.lines())[-400:])
        if child.killed():
            COUNTS["model kills that killed"] += 1
            self.killed_drivers.add(child.pid)
            self.mark_interrupted(op, args)
            return
        COUNTS["model kills that ended first"] += 1
        self.saw_points(op, args, child.points())
        if op == "cycle":
            self.cycle_done(args["queue"], args["table"], child.outcome())
        elif child.outcome().startswith("FAILED"):
            self.mark_interrupted(op, args)

    def pause_at(self, op: str, args: dict[str, Any], at: int) -> None:
        child = ms.start_child(self.config, op, args, "pause", at)
        state = child.wait_paused_or_done()
        if state != "paused":
            child.finish()
            COUNTS["model pauses that ended first"] += 1
            self.saw_points(op, args, child.points())
            if child.outcome().startswith("FAILED"):
                self.mark_interrupted(op, args)
            return
        COUNTS["model pauses that paused"] += 1
        time.sleep(self.past_expiry)
        queue = args.get("queue") or ms.QUEUES[0]
        taker = self.run("cycle", {"queue": queue, "table": "inbound", "run_id": "taker"})
        self.cycle_done(queue, "inbound", taker)
        resumed_at = time.time()
        if not child.resume():
            COUNTS[f"model paused children ended before their resume (exit {child.process.exitcode})"] += 1
        self.trace(f"pause@{at} {op}", args, " | ".join(child.lines())[-400:])
        self.paused[child.pid] = resumed_at
        self.mark_interrupted(op, args)

    # Kills are what interrupts: two rules draw them.
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        self.interrupt(data, "kill")

    @rule(data=st.data())
    def kill_again(self, data: st.DataObject) -> None:
        self.interrupt(data, "kill")

    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        self.interrupt(data, "pause")

    @precondition(lambda self: self.steps > 0)
    @rule()
    def settle_step(self) -> None:
        self.step("settle")
        self.settle()

    def settle(self) -> None:
        """Run every queue's cycles, then run again any action left planned, then the strict checks. A
        ramp goes on a step per inbound cycle: the rounds go on while one runs (its steps are few)."""
        for round_ in range(8):
            if round_ >= 2 and not any(a.state == "planned" and a.kind == "ramp" for a in ms.actions(self.config)):
                break
            for queue in ms.QUEUES:
                waiting = self.waiting(queue)
                if sum(t.startswith("retry_") for t in waiting) > self.policies[queue]["max_retry_cycles"]:
                    COUNTS["model settles with a draining retry table"] += 1
                for table in waiting:
                    self.run("cycle", {"queue": queue, "table": table, "run_id": "settle"})
            for action in ms.actions(self.config):
                if action.state == "planned":
                    self.rerun(action)
        self.interrupted.clear()
        self.check()
        left = [(a.action_id, a.kind, a.queue) for a in ms.actions(self.config) if a.state not in FINAL]
        self.require(not left, f"actions not in a final state after settle: {left}")

    def rerun(self, action: Any) -> None:
        args = dict(action.arguments)
        if action.kind == "redrive":
            self.run("redrive", {"queue": action.queue, "source": args.get("from"), "to": args.get("to"),
                                 "selection": args.get("selection") or {}, "id": action.action_id})
        elif action.kind == "purge":
            self.run("purge", {"queue": action.queue, "table": args.get("table"), "older_than": 0,
                               "selection": args.get("selection") or {}, "id": action.action_id})
        elif action.kind == "undo" and args.get("action_id"):
            self.run("undo", {"id": args["action_id"]})

    # --------------------------------------------------------------------------------- invariants

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            COUNTS["model violations"] += 1
            raise Violation(what)

    @invariant()
    def books_balance(self) -> None:
        # Hypothesis runs the invariants after each rule (the initializing one too), never before it.
        self.rules_run += 1
        COUNTS["model rules run"] += 1
        if self.steps:
            self.check()

    def check(self) -> None:
        where = ms.places(self.config)
        busy = {q for q, why in self.interrupted.items() if why}
        for message_id, copies in self.copies.items():
            found = where.get(message_id, [])
            self.require(len(found) >= copies, f"{message_id} lost: {copies} accepted, found in {found}")
            if self.reach[message_id] & busy:
                continue
            self.require(len(found) == copies, f"{message_id} in two places: {copies} accepted, found in {found}")
            outside = [(q, t) for q, t in found if q not in self.reach[message_id]]
            self.require(not outside, f"{message_id} in a queue it could not reach: {outside}")
        strays = sorted(set(where) - set(self.copies))
        self.require(not strays, f"ids never accepted are in the lake: {strays[:5]}")
        for message_id, found in where.items():
            for queue, table in found:
                if table == "purged":
                    self.require(any((queue, t, message_id) in self.purgeable for t in ms.FAILURE_TABLES),
                                 f"{message_id} in {queue}'s purged ledger though no purge found it there")
        lines = ms.product_lines(self.config)
        for queue, (received, accounted, line) in lines.items():
            if queue in busy:
                continue
            self.require(received is None or received == accounted, f"the product's own books: {line}")
        if not busy:
            total = sum(accounted for _, accounted, _ in lines.values())
            self.require(total == sum(self.copies.values()),
                         f"the queues account for {total} messages, {sum(self.copies.values())} were accepted: "
                         + "; ".join(line for _, _, line in lines.values()))
        self.check_effects()
        states = Counter(a.state for a in ms.actions(self.config))
        self.require(set(states) <= {"planned", *FINAL}, f"actions in impossible states: {states}")

    def check_effects(self) -> None:
        clean: Counter[str] = Counter()
        after_resume: Counter[int] = Counter()
        for effect in ms.effects(self.folder):
            if effect.what != "ok":
                continue
            if effect.driver in self.paused and effect.at >= self.paused[effect.driver]:
                after_resume[effect.driver] += 1
            elif effect.driver not in self.killed_drivers and effect.driver not in self.paused and effect.driver > 1:
                clean[effect.message_id] += 1
        for message_id, count in clean.items():
            self.require(count <= self.copies[message_id],
                         f"{message_id}: {count} successful side effects, {self.copies[message_id]} accepted")
        for driver, count in after_resume.items():
            self.require(count <= 1, f"paused driver {driver} delivered {count} messages after it was resumed")


def _settings() -> settings:
    examples, steps = BUDGETS.get(active_profile(), BUDGETS["ci"])
    # A run split over processes, or a longer search than `ci`: MODEL_SEQUENCES / MODEL_STEPS.
    examples = int(os.environ.get("MODEL_SEQUENCES", examples))
    steps = int(os.environ.get("MODEL_STEPS", steps))
    chosen = settings(settings.get_profile(active_profile()), max_examples=examples, stateful_step_count=steps)
    if active_profile() == "ci":
        # `make test` runs the same sequences every time: a CI run fails for a change, not a draw.
        # Searching is the long profile's work (random sequences, `make model`).
        chosen = settings(chosen, derandomize=True)
    if os.environ.get("MODEL_SHRINK") == "no":  # a failing sequence as found, in seconds rather than minutes
        chosen = settings(chosen, phases=[p for p in Phase if p is not Phase.shrink])
    return chosen


def run_lake_model(chosen: settings) -> None:
    """Run the sequences, each to all its steps. Left to itself, hypothesis ends about a third of them
    sooner (its mutations can copy the draw that ends a sequence into an earlier step); `_min_steps`,
    which hypothesis's own tests use, is the one way to ask for every step."""
    LakeModel.length = chosen.stateful_step_count
    run_state_machine_as_test(LakeModel, settings=chosen, _min_steps=chosen.stateful_step_count)


if os.environ.get("MODEL_REPRODUCE"):  # a blob hypothesis printed: run that one sequence again
    import hypothesis
    hypothesis.reproduce_failure(hypothesis.__version__, os.environ["MODEL_REPRODUCE"].encode())(LakeModel)


# `make test` runs the bounded profile in a process of its own (counting commit points patches delta-rs
# for the whole process); `make model` the long one.
@pytest.mark.model
def test_lake_model() -> None:
    run_lake_model(_settings())


@pytest.mark.model
def test_lake_model_on_an_s3_lake(s3_server: dict[str, str]) -> None:
    """The sequences with the lake on the run's S3 server: a bounded profile whatever the profile (a
    store's requests make a step about four times slower; the long search runs on a local lake)."""
    examples, steps = S3_BUDGET
    chosen = settings(_settings(), max_examples=int(os.environ.get("MODEL_S3_SEQUENCES", examples)),
                      stateful_step_count=steps)
    LakeModel.store = s3_server
    try:
        run_lake_model(chosen)
    finally:
        LakeModel.store = None
