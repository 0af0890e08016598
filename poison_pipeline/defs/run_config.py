"""What the operator runs share: who is acting and which run a re-execution continues."""

from __future__ import annotations

from dagster import OpExecutionContext

from poison_pipeline.defs.naming import ACTOR_TAG, USER_TAG

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

