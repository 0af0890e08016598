"""What the operator runs share: the selection filters of their run config, who is acting and which
run a re-execution continues."""

from __future__ import annotations

from datetime import datetime

from dagster import Config, OpExecutionContext
from pydantic import Field, field_validator

from poison_pipeline.defs.naming import ACTOR_TAG, USER_TAG
from poison_pipeline.operations.selection import Selection

DAGSTER_ACTOR = "dagster"


class SelectionConfig(Config):
    """The filters `redrive` and `purge` take on the command line; all given must hold."""

    group: str | None = Field(default=None, description="A failure group id, as `groups` shows it.")
    error_type: str | None = Field(default=None, description="ValueError, or PartObsolete for "
                                   "myapp.errors.PartObsolete.")
    message_type: str | None = None
    conversation: str | None = Field(default=None, description="A conversation id.")
    ids: list[str] | None = Field(default=None, description="Only these message ids.")
    where: str | None = Field(default=None, description="A predicate over the table's columns, as `--where` "
                              "takes it: comparisons, IN, LIKE, IS NULL, BETWEEN, AND/OR/NOT; never SQL text.")

    @field_validator("group", "error_type", "message_type", "conversation", "where")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("leave it out (null) or give a value: an empty string selects nothing")
        return value

    @field_validator("where")
    @classmethod
    def _one_predicate(cls, value: str | None) -> str | None:
        if value is not None and ";" in value:
            raise ValueError(f"{value!r}: one predicate only (no ';')")
        return value

    def selection(self, failed_after: datetime | None = None, failed_before: datetime | None = None) -> Selection:
        return Selection(group=self.group, error_type=self.error_type, message_type=self.message_type,
                         conversation=self.conversation, failed_after=failed_after, failed_before=failed_before,
                         ids=tuple(self.ids) if self.ids is not None else None, where=self.where)


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

