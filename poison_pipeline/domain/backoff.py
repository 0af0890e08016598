"""The delays between retry cycles: WCF's one fixed `retry_cycle_delay`, or an exponential back-off
with a cap and jitter (Temporal's `initial_interval`, `backoff_coefficient`, `maximum_interval`;
MassTransit's and Wolverine's jitter kinds)."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator, model_validator

from poison_pipeline.domain.durations import LONGEST, Duration

__all__ = ["Backoff", "Jitter", "JitterKind", "draw"]


class JitterKind(StrEnum):
    NONE = "none"
    # A uniform draw between 0 and the delay (AWS's "full jitter").
    FULL = "full"
    # Half the delay, plus a uniform draw up to the other half.
    EQUAL = "equal"
    # The delay less a uniform draw up to a fraction of it. Like the others it only shortens a
    # delay: a jittered delay is never longer than the one configured, so `max` stays the longest.
    BOUNDED = "bounded"


_BOUNDED = re.compile(r"^\s*bounded\s*\(\s*([0-9]*\.?[0-9]+)\s*\)\s*$")
_FORMS = "write none, full, equal or bounded(F) with 0 < F <= 1 (bounded(0.25): the delay less up to 25%)"


@dataclass(frozen=True)
class Jitter:
    """How much of a delay is drawn at random; `fraction` only for `bounded`."""

    kind: JitterKind = JitterKind.NONE
    fraction: float = 0.0

    @classmethod
    def parse(cls, value: object) -> Jitter:
        if isinstance(value, Jitter):
            return value
        if isinstance(value, str):
            bounded = _BOUNDED.fullmatch(value)
            if bounded:
                fraction = float(bounded.group(1))
                if not 0 < fraction <= 1:
                    raise ValueError(f"{value!r}: the fraction of bounded jitter must be above 0 and at most 1")
                return cls(JitterKind.BOUNDED, fraction)
            if value.strip() in {JitterKind.NONE, JitterKind.FULL, JitterKind.EQUAL}:
                return cls(JitterKind(value.strip()))
        raise ValueError(f"{value!r} is not a jitter: {_FORMS}")

    def __str__(self) -> str:
        return f"bounded({self.fraction:g})" if self.kind is JitterKind.BOUNDED else self.kind.value

    def apply(self, delay: float, draw: float) -> float:
        """`delay` (seconds) jittered by `draw`, a number in [0, 1)."""
        if self.kind is JitterKind.FULL:
            return delay * draw
        if self.kind is JitterKind.EQUAL:
            return delay / 2 + delay / 2 * draw
        if self.kind is JitterKind.BOUNDED:
            return delay * (1 - self.fraction * draw)
        return delay


JitterField = Annotated[Jitter, BeforeValidator(Jitter.parse), PlainSerializer(str, return_type=str)]


def draw(seed: str, cycle: int) -> float:
    """A number in [0, 1) fixed by a message and the retry cycle it moves to: the same history
    replayed (a restart, a simulation) computes the same delays."""
    digest = hashlib.blake2b(f"{seed}\x00{cycle}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class Backoff(BaseModel):
    """The delay before retry cycle k: `initial * multiplier ** (k - 1)`, at most `max`, then jittered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial: Duration
    multiplier: float = Field(default=2.0)
    max: Duration | None = None
    jitter: JitterField = Jitter()

    @field_validator("initial")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than zero")
        return value

    @field_validator("multiplier")
    @classmethod
    def _growing(cls, value: float) -> float:
        # Below 1 each retry cycle would come sooner than the one before: no back-off.
        if not math.isfinite(value) or value < 1:
            raise ValueError(f"{value!r} is not a multiplier: give a number of at least 1 (1 keeps the delay fixed)")
        return value

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> Backoff:
        if self.max is not None and self.max < self.initial:
            raise ValueError(f"max ({_shown(self.max)}) is below initial ({_shown(self.initial)}): "
                             "the cap must be at least the first delay")
        return self

    def base(self, cycle: int) -> timedelta:
        """The delay before retry cycle `cycle` (1 for the first) without jitter."""
        cap = (self.max or LONGEST).total_seconds()
        exponent = max(cycle - 1, 0)
        # Computed in logarithms: multiplier ** exponent overflows a float long before it is capped.
        grows = exponent * math.log(self.multiplier)
        seconds = cap if grows >= math.log(cap / self.initial.total_seconds()) else (
            self.initial.total_seconds() * math.exp(grows))
        return timedelta(seconds=min(seconds, cap))

    def delay(self, cycle: int, seed: str) -> timedelta:
        """The delay before retry cycle `cycle` of the message `seed` names, jittered."""
        base = self.base(cycle).total_seconds()
        if self.jitter.kind is JitterKind.NONE:
            return timedelta(seconds=base)
        return timedelta(seconds=self.jitter.apply(base, draw(seed, cycle)))


def _shown(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"
