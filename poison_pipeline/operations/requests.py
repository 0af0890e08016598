"""What every operator action's request shares, and who asks.

Each action declares its inputs once, as a model next to its code (`RedriveRequest` in redrive.py,
`PurgeRequest` in purge.py, ...): the Python API takes it, the command line fills it from its
options (cli/requests.py) and Dagster's Launchpad shows it as run config (the defs inherit it). So
there is one validation and one set of messages, each naming the field. What needs the lake (is the
queue declared, does a predicate fit the table's columns) is checked by the operation, before it
writes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo

from poison_pipeline.domain.paths import UnsafeName, action_id_part, operator_id
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.actions import default_actor

__all__ = ["DERIVED_ID", "ActionContext", "ActionId", "FailureTable", "Request", "action_id", "failure_table",
           "not_blank"]


class Request(BaseModel):
    """An operator's request: immutable, and a field it does not declare is an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, kw_only=True)
class ActionContext:
    """Who runs an action and under which run: recorded in the actions ledger with it. `now` fixes
    the clock (one cut-off for a preview and the action it confirms); `progress(done, total)` hears
    of each chunk written."""

    actor: str = field(default_factory=default_actor)
    run_id: str = "manual"
    now: datetime | None = None
    progress: Callable[[int, int], None] | None = None


def not_blank(value: str | None) -> str | None:
    """A text field given must say something: an empty string would select or name nothing."""
    if value is not None and not value.strip():
        raise ValueError(f"{value!r}: leave it out or give a value: an empty text selects nothing")
    return value


def failure_table(value: str) -> str:
    if value not in FAILURE_TABLES:
        raise ValueError(f"{value!r}: choose {', '.join(FAILURE_TABLES)}")
    return value


# The validation context of a request whose id the product derived (ActionName.of_run), not an
# operator: such an id is checked as a lake path part only, since it holds the separator operators'
# ids may not.
DERIVED_ID = {"derived_id": True}


def action_id(value: str | None, info: ValidationInfo) -> str | None:
    """An action id given: it names a folder of the lake, so it stays plain."""
    try:
        if info.context is not None and info.context.get("derived_id"):
            return action_id_part(value)
        return operator_id(value)
    except UnsafeName as unsafe:  # the field's name is said by whoever shows the error
        raise ValueError(str(unsafe).removeprefix("--id ")) from None


# The fields several requests share, checked where they are declared.
ActionId = Annotated[str | None, AfterValidator(action_id)]
FailureTable = Annotated[str, AfterValidator(failure_table)]
