"""The poison-message policy of one application queue (SPEC section 5; defaults are WCF's)."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from poison_pipeline.domain.durations import parse_duration
from poison_pipeline.domain.imports import check_path, import_callable, import_exception, importing

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Unrecoverable(_Strict):
    """Errors that skip the remaining retries: exception types (subclasses match) or codes."""

    exceptions: list[str] = Field(default_factory=list)
    codes: list[str] = Field(default_factory=list)
    route: UnrecoverableRoute = UnrecoverableRoute.FINAL_DISPOSITION

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


class Policy(_Strict):
    receive_retry_count: int = Field(default=5, ge=0, le=1000)
    max_retry_cycles: int = Field(default=2, ge=0, le=100)
    retry_cycle_delay: Duration = timedelta(minutes=30)
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
    # Duplicates are detected against messages processed within this window: it bounds what a
    # cycle reads to recent history instead of all of it.
    dedup_window: Duration = timedelta(days=7)
    # A body is one Arrow and Parquet value, whose lengths are 32-bit: 2 GiB at most.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0, lt=2**31)
    # A loop guard: a message an operator sent back this many times is skipped by redrive unless forced.
    max_redrives: int = Field(default=3, ge=1)

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
