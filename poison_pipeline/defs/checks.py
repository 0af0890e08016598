"""The asset checks of a queue, wired to Dagster: one step that runs after the cycle of its run.

The step depends on every cycle asset of the queue, so a cycle job that selects the checks runs them
once its cycle has committed; run alone (the UI's "Execute checks"), it checks the tables as they are.
"""

from collections.abc import Iterator
from typing import cast

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    MetadataValue,
    multi_asset_check,
)

from poison_pipeline.defs.naming import asset_key
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, FAILURE_TABLES, INBOUND, POISON
from poison_pipeline.operations.checks import (
    CONSERVATION,
    DEAD_LETTER_GROWTH,
    DEPTH,
    OLDEST_WAITING,
    ONE_PLACE,
    POISON_GROWTH,
    CheckOutcome,
    Severity,
    check_conservation,
    check_depth,
    check_growth,
    check_oldest_waiting,
    check_one_place,
)
from poison_pipeline.storage.tables import TRANSMISSION, QueueTables
from poison_pipeline.views.user_code import CodeProblem, code_problem

# The check that the queue's handler, hooks and exception types import where its runs load (the
# others are the product's own, operations/checks.py).
USER_CODE = "user_code"

_SEVERITY = {Severity.ERROR: AssetCheckSeverity.ERROR, Severity.WARN: AssetCheckSeverity.WARN}


def _specs(declaration: Declaration, queue: str) -> list[AssetCheckSpec]:
    thresholds = declaration.queue(queue).checks
    waiting = QueueTables.of(declaration, queue).waiting
    inbound = asset_key(queue, INBOUND)
    # Transmission runs change this queue's dead_letter and intake: their checks run after them too.
    after_sends = [AssetDep(asset_key(queue, TRANSMISSION))]
    return [
        AssetCheckSpec(CONSERVATION, asset=inbound, additional_deps=after_sends,
                       description="Every message the queue ever accepted is in exactly one place or terminal "
                       "outcome (the conservation line)."),
        AssetCheckSpec(ONE_PLACE, asset=inbound,
                       description="No message id is in two waiting or failure tables at once."),
        AssetCheckSpec(POISON_GROWTH, asset=asset_key(queue, POISON),
                       description=f"Poison plus quarantine grew by at most {thresholds.poison_growth} "
                       "messages since the previous check."),
        AssetCheckSpec(DEAD_LETTER_GROWTH, asset=asset_key(queue, DEAD_LETTER),
                       description=f"Dead-letter grew by at most {thresholds.dead_letter_growth} messages "
                       "since the previous check."),
        AssetCheckSpec(USER_CODE, asset=inbound,
                       description="The queue's handler, hooks and exception types import (else no cycle of it "
                       "runs and its sensors say why)."),
        *(AssetCheckSpec(OLDEST_WAITING, asset=asset_key(queue, table),
                         description="How long the oldest due message here has waited "
                         f"({thresholds.oldest_waiting.described()}).")
          for table in waiting),
        *(AssetCheckSpec(DEPTH, asset=asset_key(queue, table), additional_deps=after_sends,
                         description=f"How many messages failed here ({thresholds.depth(table).described()}): "
                         "warn is yellow, error red.")
          for table in FAILURE_TABLES),
    ]


def check_keys(declaration: Declaration, queue: str) -> list[AssetCheckKey]:
    return [spec.key for spec in _specs(declaration, queue)]


def _previous_rows(context: AssetCheckExecutionContext, key: AssetCheckKey) -> int | None:
    """The `rows` of this check's latest completed evaluation: the growth since then is measured."""
    # This run's own evaluation is already planned (newest, not completed); runs that failed before
    # evaluating leave planned records only: the first completed one is the previous evaluation.
    for record in context.instance.event_log_storage.get_asset_check_execution_history(key, limit=20):
        entry = record.event.dagster_event if record.event is not None else None
        evaluation = entry.event_specific_data if entry is not None else None
        if record.run_id != context.run.run_id and isinstance(evaluation, AssetCheckEvaluation):
            value = evaluation.metadata.get("rows")
            return int(cast(int, value.value)) if value is not None else None
    return None


def _metadata(value: object) -> MetadataValue:
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    if isinstance(value, list):
        return MetadataValue.md("\n".join(f"- {item}" for item in value) or "none")
    return MetadataValue.text("" if value is None else str(value))


def _result(queue: str, outcome: CheckOutcome) -> AssetCheckResult:
    return AssetCheckResult(
        asset_key=asset_key(queue, outcome.table),
        check_name=outcome.name,
        passed=outcome.passed,
        severity=_SEVERITY[outcome.severity],
        description=outcome.description,
        metadata={"summary": MetadataValue.text(outcome.description),
                  **{name: _metadata(value) for name, value in outcome.metadata.items()}},
    )


def user_code_evaluation(queue: str, problem: CodeProblem | None) -> AssetCheckEvaluation:
    """The user_code check of `queue`, as its inbound's sensor reports it (no run evaluates the
    checks of a queue whose cycles cannot run)."""
    return AssetCheckEvaluation(asset_key=asset_key(queue, INBOUND), check_name=USER_CODE, passed=problem is None,
                                severity=AssetCheckSeverity.ERROR, description=_code_text(problem),
                                metadata=_code_metadata(problem))


def _code_text(problem: CodeProblem | None) -> str:
    return "every handler, hook and exception type imports" if problem is None else f"does not import: {problem}"


def _code_metadata(problem: CodeProblem | None) -> dict[str, MetadataValue]:
    return {"summary": MetadataValue.text(_code_text(problem)),
            "problems": _metadata(list(problem.lines) if problem else [])}


def queue_checks(declaration: Declaration, queue: str) -> AssetChecksDefinition:
    specs = _specs(declaration, queue)
    thresholds = declaration.queue(queue).checks

    @multi_asset_check(name=f"{queue}__checks", specs=specs, can_subset=True,
                       description=f"The asset checks of queue {queue}, read from the Delta logs and "
                       "one narrow column.")
    def checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        tables = QueueTables.of(declaration, queue)
        tables.ensure()
        selected = {(key.asset_key, key.name) for key in context.selected_asset_check_keys}

        def wanted(table: str, name: str) -> bool:
            return (asset_key(queue, table), name) in selected

        if wanted(INBOUND, CONSERVATION):
            yield _result(queue, check_conservation(tables))
        if wanted(INBOUND, ONE_PLACE):
            yield _result(queue, check_one_place(tables))
        for name, table, threshold in ((POISON_GROWTH, POISON, thresholds.poison_growth),
                                       (DEAD_LETTER_GROWTH, DEAD_LETTER, thresholds.dead_letter_growth)):
            if wanted(table, name):
                previous = _previous_rows(context, AssetCheckKey(asset_key(queue, table), name))
                yield _result(queue, check_growth(tables, name, threshold, previous))
        if wanted(INBOUND, USER_CODE):
            problem = code_problem(declaration, queue)
            yield AssetCheckResult(asset_key=asset_key(queue, INBOUND), check_name=USER_CODE, passed=problem is None,
                                   severity=AssetCheckSeverity.ERROR, description=_code_text(problem),
                                   metadata=_code_metadata(problem))
        for table in tables.waiting:
            if wanted(table, OLDEST_WAITING):
                yield _result(queue, check_oldest_waiting(tables, table, thresholds.oldest_waiting))
        for table in FAILURE_TABLES:
            if wanted(table, DEPTH):
                yield _result(queue, check_depth(tables, table, thresholds.depth(table)))

    return checks
