"""The names the product gives its actions, batches and app transactions: values, not joined strings.

A name is built by one constructor and read back by one parser per kind, and two names are the same
only when they are whole-equal: nothing is ever matched by a prefix. Each kind lives in a namespace
that no operator id, queue name or table name can reach:

- **action ids**: an operator's id is one lake path part (domain/paths.py) without `--` and not
  ending with `-` (`OPERATOR_ID_RULE`). Every id the product derives from another is that id and
  its derivation joined by `--`: `<id>--<table>` (a redrive of several tables, one per table),
  `<id>--redrive` (an edit's redrive), `<id>--step<k>` (a ramp's steps), `<id>--undo` (its undo),
  and a default id is `<kind>--<12 hex digits>`; a Dagster run's, `<kind>--run-<root run id>` (its
  re-executions resume it). So a derived id is never one an operator may give, and it names one
  base and one chain of derivations.
- **batch ids** of a redrive's copies: `<action id>/<chunk>`; a ramp's parked copies:
  `<ramp id>/parked`. An action id holds no `/`, and the cycles' and transmissions' own batch ids
  (`inbound-3-1a2b3c4d`, `tx-orders-5`) hold none either.
- **sent messages**: `<sender queue>:<message id>/<n>`, and a sent message's default conversation
  `conv:<sender queue>/<message id>`: each queue's message ids are its own. A resend's
  conversation: `resend:<n>:<original conversation>`.
- **app transactions** of operator actions and of transmissions: `poison_pipeline:<kind>/<part>/...`. Queue names, table
  names and ids hold no `:`, so none of the product's per-queue transactions
  (`poison_pipeline/<queue>/fence`, `poison_pipeline/<queue>/<table>`, ...) can be one of them.

Lakes written before these namespaces stay readable: a batch's parser also reads its earlier form
(`<id>-<chunk>`), and each name knows its earlier spelling (`undo-<id>`, `<id>-redrive`, `<id>-<k>`
ramp steps, `poison_pipeline/<queue>/<id>` transactions): a lookup tries both, so an action begun by
an earlier version is found and completes under the names it began with. A Dagster run's action
(`<kind>--run-<root run id>`) has no earlier spelling: an earlier version named that run's action
`<kind>-<root run id>`, which is another action, found by its own id, and an id an operator may
type, so nothing derived from a run's action is looked up under it.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

# What joins an id and its derivation: refused inside an operator's id (see OPERATOR_ID_RULE).
SEPARATOR = "--"
OPERATOR_ID_RULE = "no '--' inside and no '-' at the end (the product derives its own ids with '--')"

EDIT_REDRIVE = "redrive"
UNDO = "undo"
_STEP = "step"
_RUN = "run-"
_DEFAULT = re.compile(r"[0-9a-f]{12}")


class ReservedName(ValueError):
    """An id an operator may not give: it could read as a name the product derives; names the rule."""


def check_operator_id(value: str, what: str = "--id") -> str:
    """`value`, when no derived name can equal it; else ReservedName with the rule. The lake path
    rule (domain/paths.py) is checked first by the caller."""
    if SEPARATOR in value or value.endswith("-"):
        raise ReservedName(f"{what} {value!r} is reserved: an operator's id has {OPERATOR_ID_RULE}")
    return value


@dataclass(frozen=True, order=True)
class ActionName:
    """An action id: the id it starts from (an operator's, or an action kind's for a default id) and
    the derivations applied to it, in order."""

    base: str
    steps: tuple[str, ...] = ()

    def __str__(self) -> str:
        return SEPARATOR.join((self.base, *self.steps))

    @classmethod
    def parse(cls, text: str) -> ActionName:
        """The name `text` spells. An id from before the namespaces has no `--`: it is a base."""
        base, *steps = text.split(SEPARATOR)
        return cls(base, tuple(steps))

    def derived(self, step: str) -> ActionName:
        return ActionName(self.base, (*self.steps, step))

    @classmethod
    def default(cls, kind: str) -> ActionName:
        """A new id, unlike any other: a rerun of the same command with the same arguments is a new
        action. Twelve hex digits are none of the derivations' words."""
        return cls(kind, (uuid.uuid4().hex[:12],))

    @classmethod
    def of_run(cls, kind: str, root_run_id: str) -> ActionName:
        """The action a Dagster run chain (named by its first run) runs when given no id: re-executing
        a failed run resumes it instead of starting another."""
        return cls(kind, (f"{_RUN}{root_run_id}",))

    def of_source(self, table: str) -> ActionName:
        """The redrive of one of the tables a redrive of several takes from."""
        return self.derived(table)

    def edit_redrive(self) -> ActionName:
        return self.derived(EDIT_REDRIVE)

    def ramp_step(self, step: int) -> ActionName:
        return self.derived(f"{_STEP}{step}")

    def undo(self) -> ActionName:
        return self.derived(UNDO)

    @property
    def is_run(self) -> bool:
        """A Dagster run's action (ActionName.of_run), not one derived from another."""
        return len(self.steps) == 1 and self.steps[0].startswith(_RUN)

    @property
    def is_default(self) -> bool:
        return len(self.steps) == 1 and _DEFAULT.fullmatch(self.steps[0]) is not None

    def legacy(self) -> str | None:
        """How an earlier version spelled this name (None: it had no such name): a derivation joined
        with `-` (`undo-<id>` for an undo, `<id>-<k>` for a ramp step)."""
        if not self.steps:
            return self.base
        parent = ActionName(self.base, self.steps[:-1]).legacy()
        if parent is None or self.is_default or self.is_run:
            return None
        last = self.steps[-1]
        if last == UNDO:
            return f"undo-{parent}"
        if last.startswith(_STEP) and last[len(_STEP):].isdigit():
            return f"{parent}-{last[len(_STEP):]}"
        return f"{parent}-{last}"

    def spellings(self) -> tuple[str, ...]:
        """This name, then its earlier spelling: how a lookup of the action finds it in any lake."""
        old = self.legacy()
        return (str(self),) if old is None or old == str(self) else (str(self), old)


def begun_earlier(undo_id: str) -> bool:
    """Whether undo `undo_id` was begun by an earlier version (`undo-<id>`, not `<id>--undo`): its
    commits keep the names it began with."""
    return ActionName.parse(undo_id).steps[-1:] != (UNDO,)


_BATCH = "/"
PARKED = "parked"


@dataclass(frozen=True, order=True)
class BatchName:
    """The batch id of copies an operator action wrote: the action and its chunk (a number), or
    `parked` for a ramp's parked copies."""

    action_id: str
    part: str

    def __str__(self) -> str:
        return f"{self.action_id}{_BATCH}{self.part}"

    @classmethod
    def chunk(cls, action_id: str, chunk: int) -> BatchName:
        return cls(action_id, str(chunk))

    @classmethod
    def parked(cls, ramp_id: str) -> BatchName:
        return cls(ramp_id, PARKED)

    @classmethod
    def parse(cls, text: str) -> BatchName | None:
        """The action batch `text` spells (its earlier form `<action id>-<chunk>` too), or None: a
        batch of a cycle, an enqueue or a transmission."""
        if _BATCH in text:
            action_id, part = text.rsplit(_BATCH, 1)
            return cls(action_id, part)
        action_id, dash, part = text.rpartition("-")
        if dash and action_id and (part.isdigit() or part == PARKED):
            return cls(action_id, part)
        return None

    def spelled(self, *, legacy: bool = False) -> str:
        """This batch id, or as an earlier version spelled it (`<action id>-<part>`)."""
        return f"{self.action_id}-{self.part}" if legacy else str(self)

    @staticmethod
    def is_legacy(text: str) -> bool:
        return _BATCH not in text

    @staticmethod
    def pattern(action_id: str, *, earlier: bool = False) -> str:
        """A regular expression matching the whole batch id of every chunk of `action_id`: `fix/0` is
        redrive fix's, `fix-2/0` is not. `earlier`: the earlier form `fix-0` too, for an action an
        earlier version wrote; that form is also a transmission's (`tx-orders-5`) or a cycle's, so
        it is matched only then."""
        name = re.escape(action_id)
        return f"^{name}(?:{_BATCH}|-)[0-9]+$" if earlier else f"^{name}{_BATCH}[0-9]+$"


_APP = "poison_pipeline:"


# How an earlier version named each kind, from its parts.
_EARLIER = {"redrive": "poison_pipeline/{0}/{1}", "undo": "poison_pipeline/{0}",
            "restore": "poison_pipeline/{0}/restore", "parked": "poison_pipeline/{0}/parked",
            "action": "poison_pipeline/{0}", "removed": "poison_pipeline/{0}/removed",
            "transmission": "poison_pipeline/transmission/{0}"}


@dataclass(frozen=True, order=True)
class AppTransaction:
    """The Delta app transaction an operator action's commits carry, so a replay writes nothing:
    `poison_pipeline:<kind>/<part>/...`. `legacy`: the name an earlier version gave the same commits,
    set when the action began under it: it completes under the name it began with."""

    kind: str
    parts: tuple[str, ...]
    legacy: str | None = None

    def __str__(self) -> str:
        return _APP + "/".join((self.kind, *self.parts))

    @classmethod
    def parse(cls, text: str) -> AppTransaction | None:
        """The operator action's transaction `text` names, or None: one of the product's own."""
        if not text.startswith(_APP):
            return None
        kind, *parts = text[len(_APP):].split("/")
        return cls(kind, tuple(parts))

    @classmethod
    def _of(cls, kind: str, parts: tuple[str, ...], legacy: bool) -> AppTransaction:
        return cls(kind, parts, _EARLIER[kind].format(*parts) if legacy else None)

    @classmethod
    def redrive(cls, source_queue: str, redrive_id: str, *, legacy: bool = False) -> AppTransaction:
        """A redrive's appends to its target, namespaced by the source queue: the same id used by two
        queues redriving into one target never reads as the other's commit. `legacy`: the redrive
        was planned by an earlier version, which named them `poison_pipeline/<queue>/<id>`."""
        return cls._of("redrive", (source_queue, redrive_id), legacy)

    @classmethod
    def undo(cls, undo_id: str, *, legacy: bool = False) -> AppTransaction:
        """An undo's appends back to the action's table."""
        return cls._of("undo", (undo_id,), legacy)

    @classmethod
    def undo_intake(cls, queue: str, undo_id: str, *, legacy: bool = False) -> AppTransaction:
        """An undo's intake rows between two queues (the intake adds its own `/intake`): the undo's
        own name; an earlier version named them after the queue, `poison_pipeline/<queue>/<undo id>`."""
        return cls("undo", (undo_id,), f"poison_pipeline/{queue}/{undo_id}" if legacy else None)

    @classmethod
    def restore(cls, undo_id: str, *, legacy: bool = False) -> AppTransaction:
        """The mark each restore commit of an undo carries."""
        return cls._of("restore", (undo_id,), legacy)

    @classmethod
    def parked(cls, ramp_id: str, *, legacy: bool = False) -> AppTransaction:
        """The append of a ramp's parked copies back to its table."""
        return cls._of("parked", (ramp_id,), legacy)

    @classmethod
    def action(cls, action_id: str) -> AppTransaction:
        """The one commit of an action's own rows: an edit's `edits` row, an archive's markers, a
        purge's ledger rows."""
        return cls._of("action", (action_id,), False)

    @classmethod
    def removed(cls, action_id: str) -> AppTransaction:
        """A purge's removal of its messages from their table."""
        return cls._of("removed", (action_id,), False)

    @classmethod
    def transmission(cls, sender: str) -> AppTransaction:
        """A sender's transmissions (its targets' inbounds, its dead_letter and notifications), each at
        the version of the transmission table it read plus one. Its earlier name,
        `poison_pipeline/transmission/<queue>`, was a cycle's of a queue named transmission whose table
        was named like the sender (`poison_pipeline/<queue>/<table>`)."""
        return cls._of("transmission", (sender,), False)

    @property
    def name(self) -> str:
        """The name the commits carry: the earlier one for an action begun under it."""
        return str(self) if self.legacy is None else self.legacy

    def spellings(self) -> tuple[str, ...]:
        """Its name, then the earlier one: whether the commit landed is read under both (an action an
        earlier version began, completed by this one)."""
        earlier = self.earlier
        return (self.name,) if earlier == self.name else (self.name, earlier)

    @property
    def earlier(self) -> str:
        """The name an earlier version gave these commits."""
        return _EARLIER[self.kind].format(*self.parts)

    def earlier_is_one_of_queue(self, queue: str) -> bool:
        """Whether the earlier name has the form of `queue`'s own transactions
        (`poison_pipeline/<queue>/<part>`): finding it there then says nothing of this action."""
        return self.earlier.split("/")[:2] == ["poison_pipeline", queue]


# A queue name (domain/declaration.py): lowercase letters, digits and _, so never a ':'.
_QUEUE = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True, order=True)
class SentName:
    """The id of a message a handler sent: `<sender queue>:<message id>/<n>`, the n-th message the
    handling of `message_id` in the sender queue sent. Each queue has its own message ids (orders'
    1001 is not refunds' 1001), so the sender is part of the name; a queue name holds no `:` and n no
    `/`, so the three parts come back whole. A redelivery of the same message sends the same ids,
    and the target drops the copies. `sender` None: sent by an earlier version, `<message id>/<n>`."""

    sender: str | None
    message_id: str
    n: int

    def __str__(self) -> str:
        sent = f"{self.message_id}/{self.n}"
        return sent if self.sender is None else f"{self.sender}:{sent}"

    @classmethod
    def parse(cls, text: str) -> SentName | None:
        """The sent message `text` names (either form), or None: an id no handler's send gave."""
        head, slash, n = text.rpartition("/")
        if not slash or not n.isdigit():
            return None
        sender, colon, message_id = head.partition(":")
        if colon and _QUEUE.fullmatch(sender):
            return cls(sender, message_id, int(n))
        return cls(None, head, int(n))


@dataclass(frozen=True, order=True)
class ConversationName:
    """The conversation a sent message goes on when neither the handler nor the message it handles
    names one: `conv:<sender queue>/<message id>`, one per message of one queue (an earlier version
    named it `conv-<message id>`, which two queues' messages with one id shared)."""

    sender: str
    message_id: str

    def __str__(self) -> str:
        return f"conv:{self.sender}/{self.message_id}"

    @classmethod
    def parse(cls, text: str) -> ConversationName | None:
        """The default conversation `text` names, or None: one a handler or producer named."""
        if not text.startswith("conv:"):
            return None
        sender, slash, message_id = text[len("conv:"):].partition("/")
        return cls(sender, message_id) if slash and _QUEUE.fullmatch(sender) else None


_RESEND = "resend:"
# How an earlier version named a resend: `<original>~resend-<n>`, which a default conversation of a
# message whose id ends so (`conv:q/x~resend-1`) also spelled.
_EARLIER_RESEND = re.compile(r"(?s)(.+)~resend-([1-9][0-9]*)")


@dataclass(frozen=True, order=True)
class ResendName:
    """The conversation a resend after a recoverable error goes on: `resend:<n>:<original>`, the n-th
    resend of the conversation `original` (never itself a resend: a resend of a resend counts on from
    the original). No default conversation (`conv:`) begins so."""

    original: str
    n: int

    def __str__(self) -> str:
        return f"{_RESEND}{self.n}:{self.original}"

    @classmethod
    def parse(cls, text: str | None) -> ResendName | None:
        """The resend `text` names (its earlier spelling too), or None: a conversation that is no resend."""
        text = text or ""
        if text.startswith(_RESEND):
            n, colon, original = text[len(_RESEND):].partition(":")
            if colon and original and n.isdigit() and not n.startswith("0"):
                return cls(original, int(n))
            return None
        match = _EARLIER_RESEND.fullmatch(text)
        return cls(match.group(1), int(match.group(2))) if match else None
