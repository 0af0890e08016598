"""What the operator runs share: who is acting and which run a re-execution continues."""

from __future__ import annotations

from typing import Any, TypeVar

from dagster import OpExecutionContext

from poison_pipeline.defs.naming import ACTOR_TAG, USER_TAG
from poison_pipeline.domain.names import ActionName
from poison_pipeline.operations.requests import DERIVED_ID, Request

R = TypeVar("R", bound=Request)

DAGSTER_ACTOR = "dagster"


ACTOR_HELP = "Who acts (recorded in the actions ledger); default: the run's user tag."


def actor_of(context: OpExecutionContext, configured: str | None) -> str:
    """Who acts: the config's `actor`, else the run's ACTOR_TAG, else Dagster's user tag, else 'dagster'."""
    if configured and configured.strip():
        return configured
    tags = context.run.tags
    return tags.get(ACTOR_TAG) or tags.get(USER_TAG) or DAGSTER_ACTOR


def root_run_id(context: OpExecutionContext) -> str:
    """The first run of a chain of re-executions: what a resumable action's id is derived from, so
    re-executing a failed run completes its action instead of starting another."""
    return context.run.root_run_id or context.run.run_id


def run_request(model: type[R], fields: dict[str, Any], context: OpExecutionContext, kind: str) -> R:
    """An action's request from a run's config: its id the config's, else the run chain's
    (`<kind>--run-<root run id>`, which no operator can type), so a re-execution resumes it."""
    if fields.get("id") is not None:
        return model.model_validate(fields)
    return model.model_validate(fields | {"id": str(ActionName.of_run(kind, root_run_id(context)))},
                                context=DERIVED_ID)
