"""The declaration file: lake root, Spark settings and application queues."""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from poison_pipeline.domain.durations import Duration
from poison_pipeline.domain.envelope import shown
from poison_pipeline.domain.imports import IMPORT_CODE, check_path, import_callable, importing
from poison_pipeline.domain.policy import Ordering, PoisonQueuePolicy, Policy
from poison_pipeline.domain.redaction import MASK, SECRET_KEY, masked, redacted, remember
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.domain.user_code import DEFAULT_HOOK_TIMEOUT
from poison_pipeline.handlers import batch_size

_QUEUE_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
CONFIG_ENV = "POISON_PIPELINE_CONFIG"
_WORD = re.compile(r"[\w-]+")
# The tables a declared retention purges: where failed messages stay until someone decides.
# The failure tables, and the messages archived (operations/archive.py: their own retention).
RETENTION_TABLES = (*FAILURE_TABLES, "archived")


class DeclarationError(ValueError):
    """The declaration is invalid; the message names every field, value and rule broken."""


class SparkSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, redacted(value) if name == "config" else value

    master: str = "local[*]"
    remote: str | None = None
    app_name: str = "poison_pipeline"
    config: dict[str, str] = Field(default_factory=dict)

    @field_validator("config", mode="before")
    @classmethod
    def _values_as_text(cls, value: object) -> object:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value

    @field_validator("remote")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("sc://"):
            raise ValueError("a Spark Connect endpoint starts with sc:// (e.g. sc://host:15002)")
        return value


class LeaseSettings(BaseModel):
    """How a second starter of a queue's work waits for the one already running (one writer per queue)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # How long a starter waits for the lease before it fails naming the holder.
    wait: Duration = timedelta(minutes=2)
    # A lease not renewed for this long is expired: a holder killed with kill -9 loses it.
    expiry: Duration = timedelta(minutes=1)

    @field_validator("expiry")
    @classmethod
    def _renewable(cls, value: timedelta) -> timedelta:
        # The holder renews at a third of the expiry: shorter than this, renewals would be all it does.
        if value < timedelta(milliseconds=300):
            raise ValueError("the lease expiry must be at least 300ms (the holder renews it every third of it)")
        return value

    @field_validator("wait")
    @classmethod
    def _not_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("the lease wait must not be negative (0 fails at once when the queue is busy)")
        return value


class SmallCycles(BaseModel):
    """Which cycles skip Spark's job for their delivery: those of at most `max_messages` due messages.

    They run the same routing code (engine/batch.Processor) in one worker process beside the driver,
    isolated as a Spark worker is (a handler that kills its process kills only that worker), without
    the fixed cost of scheduling a Spark job. 0 sends every cycle through Spark."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_messages: int = 1000

    @field_validator("max_messages")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be a number of messages, 0 or more (0 sends every cycle through Spark)")
        return value


def _positive_duration(name: str, value: timedelta, example: str) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"{name} must be a positive duration (e.g. {example}), not {value}")
    return value


class _Levels(BaseModel):
    """A check's two levels, `warn` below `error`; either may be left out (none: it always passes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warn: Any = None
    error: Any = None

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.warn is not None and self.error is not None and self.error < self.warn:
            raise ValueError(f"error ({self.error}) is below warn ({self.warn})")
        return self

    def described(self) -> str:
        """The levels as checks' descriptions name them: `warn at 1, error at 100`."""
        return ", ".join(f"{name} at {value}" for name, value in (("warn", self.warn), ("error", self.error))
                         if value is not None) or "no levels: always passes"


class DepthLevels(_Levels):
    """How many messages in a failure table make its check fail: at `warn` or more, a warning; at
    `error` or more, an error (either may be left out)."""

    warn: int | None = None
    error: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _none_is_off(cls, value: object) -> object:
        return {} if value is None else value

    @field_validator("warn", "error")
    @classmethod
    def _at_least_one(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"a level is a number of messages, 1 or more, not {value}")
        return value


class AgeLevels(_Levels):
    """How long the oldest due message may wait before its table's check fails: past `warn`, a
    warning; past `error`, an error. A plain duration is `warn` alone."""

    warn: Duration | None = None
    error: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_duration(cls, value: object) -> object:
        if value is None:
            return {}  # no levels: the check always passes
        return {"warn": value} if isinstance(value, str | int | float | timedelta) else value

    @field_validator("warn", "error")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        return None if value is None else _positive_duration("oldest_waiting", value, "1h")


# By default a message in a failure table is a warning: the asset graph shows it until it leaves.
_ANY_FAILED = DepthLevels(warn=1)


class CheckThresholds(BaseModel):
    """When the queue's checks fail: growth since the previous check (a warning), messages in each
    failure table and the age of the oldest due message (two levels each)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    poison_growth: int = 100  # more messages on the poison path (poison + quarantine) than this
    dead_letter_growth: int = 100
    poison: DepthLevels = _ANY_FAILED
    dead_letter: DepthLevels = _ANY_FAILED
    quarantine: DepthLevels = _ANY_FAILED
    oldest_waiting: AgeLevels = AgeLevels(warn=timedelta(hours=1))  # a message due longer, not yet taken

    @field_validator("poison_growth", "dead_letter_growth")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("a growth threshold is a number of messages, 0 or more (0 warns on any growth)")
        return value

    def depth(self, table: str) -> DepthLevels:
        """The levels of failure table `table`'s depth check."""
        levels: DepthLevels = getattr(self, table)
        return levels


# The fastest a queue is looked at: the orchestrator's sensor loop (Dagster's daemon) runs every 5 s.
FASTEST_LOOK = timedelta(seconds=5)
# How long a run may stay taking arrivals: past this, other work of the queue waits too long for it.
LONGEST_STAY = timedelta(hours=1)


class Latency(BaseModel):
    """How soon a queue's runs take what arrives.

    `look_every`: how often the queue's sensors look for due messages (by default 30 s for the
    inbound and the transmission queue, 60 s for retry subqueues and the poison table; 5 s at the
    fastest). `stay`: how long a run of the inbound goes on taking new arrivals, a cycle as soon as
    one is due, before it ends and the next run takes over (0, the default: one cycle per run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    look_every: Duration | None = None
    stay: Duration = timedelta(0)

    @field_validator("look_every")
    @classmethod
    def _not_faster_than_the_loop(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < FASTEST_LOOK:
            raise ValueError(f"sensors look every 5s at the fastest (Dagster's daemon loop), not every {value}")
        return value

    @field_validator("stay")
    @classmethod
    def _bounded_stay(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= LONGEST_STAY:
            raise ValueError(f"stay must be from 0 (one cycle per run) to 1h, not {value}")
        return value


class QueueDeclaration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    handler: str
    policy: Policy = Field(default_factory=Policy)
    poison_queue: PoisonQueuePolicy = Field(default_factory=PoisonQueuePolicy)
    # Called once per ended conversation so the application can drop the state it kept for it:
    # hook(conversation_id=..., code=..., description=..., queue=...).
    on_conversation_end: str | None = None
    # The message types this queue accepts from other queues' handlers (its contract); a sent
    # message of another type fails its conversation with error -8428. None accepts every type.
    message_types: list[str] | None = None
    # The queues this queue's handler sends to: only for the lineage the UI draws.
    sends_to: list[str] = Field(default_factory=list)
    # How long failed messages are kept before the daily retention purges them for good, per table
    # (poison, dead_letter, quarantine), by failure time, e.g. {dead_letter: 30d, quarantine: 90d}.
    # A table not named here is kept until an operator purges it.
    retention: dict[str, Duration] = Field(default_factory=dict)
    # Thresholds of the asset checks run after every cycle, e.g. {quarantine: {warn: 1, error: 100},
    # oldest_waiting: {warn: 15m, error: 1h}, poison_growth: 100}.
    checks: CheckThresholds = Field(default_factory=CheckThresholds)
    # How often its sensors look and how long a run stays taking arrivals, e.g. {look_every: 5s, stay: 1m}.
    latency: Latency = Field(default_factory=Latency)

    @field_validator("retention")
    @classmethod
    def _retention_tables(cls, value: dict[str, timedelta]) -> dict[str, timedelta]:
        for table, age in value.items():
            if table not in RETENTION_TABLES:
                raise ValueError(f"retention applies to poison, dead_letter, quarantine or archived, not {table!r}")
            if age <= timedelta(0):
                raise ValueError(f"the retention of {table} must be a positive duration (e.g. 30d), not {age}")
        return value

    @field_validator("handler")
    @classmethod
    def _import_path(cls, value: str, info: ValidationInfo) -> str:
        import_callable(value) if importing(info.context) else check_path(value)
        return value

    @field_validator("on_conversation_end")
    @classmethod
    def _hook_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            import_callable(value) if importing(info.context) else check_path(value)
        return value

    @property
    def contract(self) -> str:
        """A fingerprint of what this queue accepts from senders: a message sent under one
        contract and offered under another meets an altered queue (error -8469)."""
        terms = json.dumps([self.message_types, self.policy.max_body_bytes], sort_keys=True)
        return hashlib.sha1(terms.encode()).hexdigest()[:12]

    @model_validator(mode="after")
    def _batch_handler_unordered(self, info: ValidationInfo) -> QueueDeclaration:
        # A batch call cannot hold the later messages of a conversation behind a failed earlier one.
        if (importing(info.context) and self.policy.ordering is Ordering.CONVERSATION
                and batch_size(import_callable(self.handler))):
            raise ValueError(
                f"handler {self.handler} takes whole batches (@batch_handler), which cannot keep a "
                "conversation in order: use a handler of one message with policy.ordering: conversation"
            )
        return self


class Declaration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lake_root: str
    storage_options: dict[str, str] = Field(default_factory=dict)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    queues: dict[str, QueueDeclaration]
    # Called with a QueueEvent when a queue is disabled: where a user points mail or chat.
    alert_hook: str | None = None
    # How long a clean-up hook (on_conversation_end) or the alert hook may run: past it the call
    # counts as failed (a clean-up is then tried again by the queue's next cycle).
    hook_timeout: Duration = DEFAULT_HOOK_TIMEOUT
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    small_cycles: SmallCycles = Field(default_factory=SmallCycles)

    def __repr_args__(self) -> Any:
        # repr and str of a declaration end up in logs and error messages: no credentials there.
        for name, value in super().__repr_args__():
            yield name, masked(value) if name == "storage_options" else value

    @field_validator("storage_options")
    @classmethod
    def _credentials_never_shown(cls, value: dict[str, str]) -> dict[str, str]:
        # Errors repeating them are raised far from the declaration (deep in delta-rs): noted here,
        # they are hidden wherever such an error is shown (domain/redaction.py).
        remember(value)
        return value

    @field_validator("hook_timeout")
    @classmethod
    def _positive_hook_timeout(cls, value: timedelta) -> timedelta:
        return _positive_duration("hook_timeout", value, "60s")

    @field_validator("alert_hook")
    @classmethod
    def _alert_hook_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            import_callable(value) if importing(info.context) else check_path(value)
        return value

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: dict[str, QueueDeclaration]) -> dict[str, QueueDeclaration]:
        if not value:
            raise ValueError("declare at least one queue")
        for name in value:
            if not _QUEUE_NAME.fullmatch(name):  # match's $ would let "q\n" through
                raise ValueError(
                    f"queue name {name!r} must be lowercase letters, digits and _, "
                    "starting with a letter (it names tables and Dagster assets)"
                )
        for name, queue in value.items():
            unknown = [q for q in queue.sends_to if q not in value or q == name]
            if unknown:
                raise ValueError(f"queue {name!r}: sends_to {unknown[0]!r} is not another declared queue")
        return value

    def senders_to(self, target: str) -> list[str]:
        """The queues that declare they send to `target`."""
        return [name for name, queue in self.queues.items() if target in queue.sends_to]

    def queue(self, name: str) -> QueueDeclaration:
        if name not in self.queues:
            raise KeyError(f"no queue {name!r} is declared; declared: {', '.join(self.queues)}")
        return self.queues[name]


def _format(error: ValidationError, source: str, what: str = "declaration") -> str:
    lines = [f"invalid {what} {source}:"]
    for item in error.errors():
        where = field_path(item["loc"])
        # One line per error, whatever an import error or a value quoted in it holds.
        message = " ".join(item["msg"].removeprefix("Value error, ").splitlines())
        lines.append(f"  {where} = {shown(_shown_input(item['loc'], item.get('input')), 200)}: {message}")
    return "\n".join(lines)


def field_path(loc: tuple[int | str, ...]) -> str:
    """A field's path as the error names it: `queues.orders.policy.time_to_live`; a part that is not
    a plain word (a queue named "q\n", a storage option " ") quoted, so every error stays one line
    and no part can be mistaken for another."""
    parts = [str(part) if isinstance(part, int) or _WORD.fullmatch(part) else repr(part) for part in loc]
    return ".".join(parts) or "(top level)"


def _shown_input(loc: tuple[int | str, ...], value: object) -> object:
    """The value an error was about, storage options masked (an error about a missing top-level
    field is about the whole declaration)."""
    if loc[:1] == ("storage_options",):
        return masked(value) if len(loc) == 1 else MASK
    if loc[:2] == ("spark", "config"):
        return redacted(value) if len(loc) == 2 else (MASK if SECRET_KEY.search(str(loc[2])) else value)
    if loc[:1] == ("spark",) and isinstance(value, dict) and isinstance(value.get("config"), dict):
        return {**value, "config": redacted(value["config"])}
    if isinstance(value, dict) and "storage_options" in value:
        value = {**value, "storage_options": masked(value["storage_options"])}
    if isinstance(value, dict) and isinstance(value.get("spark"), dict) and "config" in value["spark"]:
        value = {**value, "spark": {**value["spark"], "config": redacted(value["spark"]["config"])}}
    return value


def parse_declaration(data: Any, source: str = "<dict>", base_dir: Path | None = None, *,
                      import_code: bool = True) -> Declaration:
    """Validate a declaration given as data; relative lake roots resolve against `base_dir`.
    `import_code`: import the handlers, hooks and exception types it names (what running its queues
    needs), each refused like any other invalid value; else only check how their paths are written."""
    if not isinstance(data, dict):
        raise DeclarationError(f"invalid declaration {source}: expected a mapping at the top level")
    try:
        declaration = Declaration.model_validate(data, context={IMPORT_CODE: import_code})
    except ValidationError as error:
        raise DeclarationError(_format(error, source)) from None
    root = declaration.lake_root
    if "://" not in root and not os.path.isabs(root):
        root = str(((base_dir or Path.cwd()) / root).resolve())
        declaration = declaration.model_copy(update={"lake_root": root})
    return declaration


def load_declaration(path: str | os.PathLike[str] | None = None, *, import_code: bool = True) -> Declaration:
    """Load the declaration from `path`, else $POISON_PIPELINE_CONFIG, else ./poison_pipeline.yaml
    (`import_code`: as parse_declaration's)."""
    chosen = declaration_path(path)
    data = _read_yaml(chosen, "declaration")
    return parse_declaration(data, str(chosen), chosen.parent, import_code=import_code)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """A queue's `policy` from a file of its own (a candidate for `simulate`): the policy's fields at
    the top level, or under a single `policy` key (a queue's section pasted as it is)."""
    chosen = Path(path)
    return parse_policy(_read_yaml(chosen, "policy"), str(chosen))


def policy_of_yaml(text: str, source: str) -> Policy:
    """A policy given as YAML text (a candidate typed into a form), named `source` in errors."""
    return parse_policy(_yaml(text, f"{source} is"), source)


def parse_policy(data: Any, source: str = "<dict>") -> Policy:
    """A policy given as data (`load_policy`), its exception types imported."""
    if isinstance(data, dict) and set(data) == {"policy"}:
        data = data["policy"]
    if not isinstance(data, dict):
        raise DeclarationError(f"invalid policy {source}: expected a mapping of policy fields at the top level")
    try:
        return Policy.model_validate(data, context={IMPORT_CODE: True})
    except ValidationError as error:
        raise DeclarationError(_format(error, source, "policy")) from None


def _read_yaml(path: Path, what: str) -> Any:
    if not path.is_file():
        raise DeclarationError(f"{what} file {path} does not exist")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DeclarationError(f"{what} {path} is not UTF-8 text (byte {error.start})") from None
    return _yaml(text, f"{what} {path} is")


def _yaml(text: str, named: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise DeclarationError(f"{named} not valid YAML: {error}") from None


def declaration_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The file `load_declaration(path)` reads."""
    return Path(path or os.environ.get(CONFIG_ENV) or default_declaration_path())


def default_declaration_path() -> Path:
    return Path.cwd() / "poison_pipeline.yaml"
