"""The poison-message policy of one application queue (SPEC section 5; defaults are WCF's)."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from poison_pipeline.domain.backoff import Backoff
from poison_pipeline.domain.durations import Duration
from poison_pipeline.domain.imports import check_path, import_callable, import_exception, importing


class ReceiveErrorHandling(StrEnum):
    FAULT = "fault"
    DROP = "drop"
    REJECT = "reject"
    MOVE = "move"


class UnrecoverableRoute(StrEnum):
    FINAL_DISPOSITION = "final_disposition"
    QUARANTINE = "quarantine"


class Ordering(StrEnum):
    NONE = "none"
    CONVERSATION = "conversation"


class OnConversationPoison(StrEnum):
    RETRY_WHOLE = "retry_whole"
    END_CONVERSATION = "end_conversation"


class OnUndefinedError(StrEnum):
    RESEND = "resend"
    DEAD_LETTER = "dead_letter"


class OutageRecovery(StrEnum):
    # A queue disabled by an outage waits for an operator's `enable` (Service Broker).
    MANUAL = "manual"
    # Its sensor tries a few messages every interval and resumes it on a success (NServiceBus's
    # automatic rate limiting, MassTransit's kill switch, Wolverine's circuit breaker).
    PROBE = "probe"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Matching(_Strict):
    """Errors named by exception type (subclasses match) or by code."""

    exceptions: list[str] = Field(default_factory=list)
    codes: list[str] = Field(default_factory=list)

    @field_validator("codes", mode="before")
    @classmethod
    def _codes_as_text(cls, value: object) -> object:
        # Handlers raise codes as ints or strings; comparing their text makes 42 and "42" agree.
        if isinstance(value, list):
            return [str(v) for v in value]
        return value

    @field_validator("exceptions")
    @classmethod
    def _exception_paths(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for path in value:
            import_exception(path) if importing(info.context) else check_path(path)
        return value


class Unrecoverable(_Matching):
    """Errors that skip the remaining retries: exception types (subclasses match) or codes."""

    route: UnrecoverableRoute = UnrecoverableRoute.FINAL_DISPOSITION


# What a rule may change for the failures it matches.
OVERRIDES = ("receive_retry_count", "max_retry_cycles", "retry_cycle_delay", "backoff", "receive_error_handling")


class Probe(_Strict):
    """How a queue disabled by an outage is probed (`outage_recovery: probe`)."""

    interval: Duration = timedelta(minutes=5)
    messages: int = Field(default=1, ge=1, le=1000)

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than zero")
        return value


class Rule(_Matching):
    """The retries of the failures it matches (by exception type or code, as `unrecoverable`): the
    counts, the delays and the final disposition it sets replace the policy's. The first rule that
    matches a message's last failure decides."""

    receive_retry_count: int | None = Field(default=None, ge=0, le=1000)
    max_retry_cycles: int | None = Field(default=None, ge=0, le=100)
    retry_cycle_delay: Duration | None = None
    backoff: Backoff | None = None
    receive_error_handling: ReceiveErrorHandling | None = None

    @model_validator(mode="after")
    def _matches_and_changes_something(self) -> Rule:
        if not self.exceptions and not self.codes:
            raise ValueError("a rule matches failures: give it exceptions or codes")
        if all(getattr(self, name) is None for name in OVERRIDES):
            raise ValueError(f"a rule changes something: give it one of {', '.join(OVERRIDES)}")
        if self.retry_cycle_delay is not None and self.backoff is not None:
            raise ValueError("give a rule retry_cycle_delay (fixed) or backoff, not both")
        return self

    @field_validator("retry_cycle_delay")
    @classmethod
    def _not_negative(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError("must not be negative")
        return value


class Policy(_Strict):
    receive_retry_count: int = Field(default=5, ge=0, le=1000)
    max_retry_cycles: int = Field(default=2, ge=0, le=100)
    retry_cycle_delay: Duration = timedelta(minutes=30)
    # Exponential delays between retry cycles instead of the fixed retry_cycle_delay.
    backoff: Backoff | None = None
    receive_error_handling: ReceiveErrorHandling = ReceiveErrorHandling.FAULT
    time_to_live: Duration | None = None
    handler_timeout: Duration | None = None
    unrecoverable: Unrecoverable = Field(default_factory=Unrecoverable)
    ordering: Ordering = Ordering.NONE
    # What happens to a conversation whose message reaches its final disposition: it follows that
    # disposition as a whole (WCF sessions), or it is ended with this application error code
    # (Service Broker option C: skipping one message would leave the exchange in an illegal state).
    on_conversation_poison: OnConversationPoison = OnConversationPoison.RETRY_WHOLE
    conversation_error_code: int = Field(default=1, gt=0, lt=2**63)  # stored as a 64-bit integer
    # Service Broker disables a queue after five rollbacks in a row. Here: this many messages in a
    # row failed with an error that points at a dependency (`outage_errors`, subclasses included)
    # and nothing succeeded in between. Other failures are the messages' own business (a profile
    # that does not exist yet), so they neither count nor reset the run. 0 turns detection off.
    outage_threshold: int = Field(default=5, ge=0)
    outage_errors: list[str] = Field(
        default_factory=lambda: ["ConnectionError", "TimeoutError", "poison_pipeline.domain.errors:HandlerTimeout"]
    )
    # A sent conversation that fails with an error Service Broker leaves undefined (-8470 target
    # dropped, -8469 altered, -8487 contract dropped): resend its pending messages or dead-letter them.
    on_undefined_error: OnUndefinedError = OnUndefinedError.DEAD_LETTER
    # What ends an outage: an operator (`enable`), or a probe of `probe.messages` messages every
    # `probe.interval`, charged nothing, that resumes the queue on its first success.
    outage_recovery: OutageRecovery = OutageRecovery.MANUAL
    probe: Probe = Field(default_factory=Probe)
    # Duplicates are detected against messages processed within this window: it bounds what a
    # cycle reads to recent history instead of all of it.
    dedup_window: Duration = timedelta(days=7)
    # A body is one Arrow and Parquet value, whose lengths are 32-bit: 2 GiB at most.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0, lt=2**31)
    # A loop guard: a message an operator sent back this many times is skipped by redrive unless forced.
    max_redrives: int = Field(default=3, ge=1)
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("outage_errors")
    @classmethod
    def _outage_exceptions(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for path in value:
            import_exception(path) if importing(info.context) else check_path(path)
        return value

    @field_validator("retry_cycle_delay", "dedup_window")
    @classmethod
    def _not_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    @field_validator("time_to_live", "handler_timeout")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be greater than zero")
        return value

    @model_validator(mode="after")
    def _one_delay_and_rules_within_the_queues(self) -> Policy:
        if self.backoff is not None and "retry_cycle_delay" in self.model_fields_set:
            raise ValueError("give retry_cycle_delay (a fixed delay) or backoff, not both")
        for number, rule in enumerate(self.rules):
            if rule.max_retry_cycles is not None and rule.max_retry_cycles > self.max_retry_cycles:
                raise ValueError(
                    f"rules[{number}].max_retry_cycles is {rule.max_retry_cycles}, more than the policy's "
                    f"max_retry_cycles ({self.max_retry_cycles}): the policy's count makes the retry subqueues, "
                    "a rule can only use fewer")
        return self

    @cached_property
    def under_rules(self) -> tuple[Policy, ...]:
        """The policy each rule makes, in the rules' order: this policy with the rule's overrides."""
        made = []
        for rule in self.rules:
            update: dict[str, object] = {"rules": []}
            for name in OVERRIDES:
                if getattr(rule, name) is not None:
                    update[name] = getattr(rule, name)
            if rule.retry_cycle_delay is not None:
                update["backoff"] = None
            made.append(self.model_copy(update=update))
        return tuple(made)

    def under(self, rule: int | None) -> Policy:
        """The policy for a failure that rule number `rule` matched (None: no rule did)."""
        return self if rule is None else self.under_rules[rule]

    def delay_before(self, cycle: int, seed: str) -> timedelta:
        """The delay before retry cycle `cycle` (1 for the first) of the message `seed` names."""
        return self.retry_cycle_delay if self.backoff is None else self.backoff.delay(cycle, seed)

    @property
    def max_attempts(self) -> int:
        """WCF's bound on deliveries: (ReceiveRetryCount + 1) * (MaxRetryCycles + 1)."""
        return (self.receive_retry_count + 1) * (self.max_retry_cycles + 1)


class PoisonQueuePolicy(_Strict):
    """How the poison subqueue is read; without a handler its messages go to quarantine."""

    handler: str | None = None
    receive_retry_count: int = Field(default=0, ge=0, le=1000)
    receive_error_handling: ReceiveErrorHandling = ReceiveErrorHandling.DROP
    handler_timeout: Duration | None = None

    @field_validator("handler")
    @classmethod
    def _handler_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            import_callable(value) if importing(info.context) else check_path(value)
        return value

    @field_validator("receive_error_handling")
    @classmethod
    def _no_move(cls, value: ReceiveErrorHandling) -> ReceiveErrorHandling:
        if value is ReceiveErrorHandling.MOVE:
            raise ValueError(
                "the poison queue's receive_error_handling must be drop, reject or fault: "
                "'move' has no further poison queue to move to"
            )
        return value
