"""Assets of one application queue: each waiting table's materialization is one retry cycle."""

from collections.abc import Callable
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from poison_pipeline.broker.transmission import transmit
from poison_pipeline.defs.failure_metadata import (
    changed_ledgers,
    failure_group_metadata,
    health_metadata,
    ledger_versions,
    table_metadata,
)
from poison_pipeline.defs.naming import PROBE_TAG, asset_key
from poison_pipeline.defs.resources import SparkResource
from poison_pipeline.defs.waiting_runs import other_work_waiting
from poison_pipeline.domain.declaration import Declaration
from poison_pipeline.domain.routing import DEAD_LETTER, INBOUND, POISON, PROCESSED, QUARANTINE
from poison_pipeline.engine.cycle import CycleReport
from poison_pipeline.engine.stay import stay
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.storage.faults import redacted_failures
from poison_pipeline.storage.tables import TRANSMISSION, QueueTables

_OUTCOMES = ("processed", "duplicate", "moved", "poisoned", "rejected", "expired", "dropped",
             "quarantined", "faulted", "ended", "outage", "messages", "attempts", "conversations_ended",
             "transmitted", "conversation_errors")
_FAILED = ("poisoned", "rejected", "expired", "quarantined", "ended")

_DESCRIPTIONS = {
    INBOUND: "Messages waiting for their first cycle; materializing runs that cycle on Spark.",
    POISON: "Messages that exhausted every retry cycle; materializing runs the poison handler.",
    DEAD_LETTER: "Rejected, expired and undeliverable messages, each with its reason.",
    QUARANTINE: "Raw body, context and error of every poison message, kept for people.",
    PROCESSED: "Ledger of every message id that reached a terminal outcome.",
    TRANSMISSION: "Messages this queue's handlers sent, waiting until their target accepts them; "
    "materializing offers them.",
}


def _spec(declaration: Declaration, queue: str, table: str, upstream: list[str], description: str,
          spark: bool = False, extra: list[AssetKey] | None = None) -> dict[str, Any]:
    """What every asset of a queue declares: its key, lineage, group, kinds and table."""
    return {
        "key": asset_key(queue, table),
        "deps": [asset_key(queue, t) for t in upstream] + (extra or []),
        "group_name": queue,
        "kinds": {"spark", "delta"} if spark else {"delta"},
        "description": description,
        "metadata": {"table_uri": QueueTables.of(declaration, queue).uri(table)},
    }


def cycle_metadata(report: CycleReport) -> dict[str, Any]:
    """Numeric metadata, so the UI plots each outcome over time."""
    counts = report.counts
    if report.recovered:
        counts = {k: counts.get(k, 0) + report.recovered.get(k, 0)
                  for k in set(counts) | set(report.recovered)}
    metadata: dict[str, Any] = {name: MetadataValue.int(int(counts.get(name, 0))) for name in _OUTCOMES}
    # What the cycle put in a failure table (poison, dead_letter, quarantine).
    metadata["failed"] = MetadataValue.int(sum(int(counts.get(name, 0)) for name in _FAILED))
    metadata["duration_s"] = MetadataValue.float(round(report.duration_s, 3))
    metadata["oldest_age_s"] = MetadataValue.float(round(report.oldest_age_s or 0.0, 3))
    metadata["cycle_seq"] = MetadataValue.int(report.seq)
    metadata["recovered_staged_cycle"] = MetadataValue.bool(report.recovered is not None)
    metadata["skipped"] = MetadataValue.text(report.skipped or "")
    metadata["cleanup_hook_failures"] = MetadataValue.int(len(report.cleanup_failures))
    metadata["interrupted_actions_completed"] = MetadataValue.int(len(report.interrupted.completed))
    if report.probe:  # a probe of a queue an outage disabled: how many messages it tried at most
        metadata["probe_messages"] = MetadataValue.int(report.probe)
    if report.interrupted.completed or report.interrupted.abandoned or report.interrupted.left:
        metadata["interrupted_actions"] = MetadataValue.json(
            {"completed": report.interrupted.completed, "abandoned": report.interrupted.abandoned,
             "left": report.interrupted.left})
    return metadata


def _cycle_asset(declaration: Declaration, queue: str, table: str, upstream: list[str]) -> AssetsDefinition:
    description = _DESCRIPTIONS.get(
        table, f"Messages waiting out retry cycle {table.removeprefix('retry_')}'s delay; "
        "materializing runs that cycle on Spark."
    )

    # What other queues' handlers send arrives in the inbound through their transmission queues.
    senders = [asset_key(q, TRANSMISSION) for q in declaration.senders_to(queue)] if table == INBOUND else []

    # Only the inbound's runs stay: arrivals are what an application waits for; retry subqueues
    # come due on their delay, which their sensors see in time.
    stays = declaration.queue(queue).latency.stay.total_seconds() if table == INBOUND else 0.0

    @asset(**_spec(declaration, queue, table, upstream, description, spark=True, extra=senders))
    def cycle(context: AssetExecutionContext, spark: SparkResource) -> MaterializeResult:
        with redacted_failures():
            return _cycle(context, spark)

    def _cycle(context: AssetExecutionContext, spark: SparkResource) -> MaterializeResult:
        before = ledger_versions(declaration, queue)
        # The inbound sensor's probe of a queue an outage disabled (`outage_recovery: probe`).
        probe = context.run.tags.get(PROBE_TAG) == "true"

        def one_cycle() -> CycleReport:
            report = run_cycle(lambda: spark.spark_session, declaration, queue, table, run_id=context.run.run_id,
                               on_wait=lambda holder: context.log.warning(
                                   f"{queue}: waiting for the queue's lease, held by {holder.describe()}"),
                               probe=probe)
            if report.skipped:
                context.log.warning(f"{queue}/{table}: processed nothing: {report.skipped}")
            else:
                context.log.info(f"{queue}/{table}: cycle {report.seq}: {report.counts}")
            return report

        report = one_cycle()
        if stays and not probe:
            job = context.job_name
            for later in stay(one_cycle, QueueTables.of(declaration, queue), table, seconds=stays,
                              give_way=lambda: other_work_waiting(context.instance, queue, job)):
                # Each cycle of a staying run is a materialization of its own, as a run's one would be.
                context.log_event(AssetMaterialization(asset_key(queue, table), metadata=cycle_metadata(report)))
                report = later
        for unfinished in report.cleanup_failures:
            context.log.warning(f"{queue}: the clean-up hook of ended conversation {unfinished.conversation_id!r} "
                                f"has not succeeded ({unfinished.failures} failed tries; retried every cycle): "
                                f"{unfinished.last_error}")
        for materialization in changed_ledgers(declaration, queue, before):
            context.log_event(materialization)
        metadata = {**cycle_metadata(report), **health_metadata(declaration, queue)}
        if table == POISON:
            metadata.update(failure_group_metadata(failure_groups(declaration, queue, POISON)))
        return MaterializeResult(metadata=metadata)

    return cycle


def _ledger_asset(declaration: Declaration, queue: str, table: str, upstream: list[str]) -> AssetsDefinition:
    @asset(**_spec(declaration, queue, table, upstream, _DESCRIPTIONS[table]))
    def ledger(context: AssetExecutionContext) -> MaterializeResult:
        with redacted_failures():
            QueueTables.of(declaration, queue).ensure()
            return MaterializeResult(metadata=table_metadata(declaration, queue, table))

    return ledger


def _transmission_asset(declaration: Declaration, queue: str, table: str, upstream: list[str]) -> AssetsDefinition:
    @asset(**_spec(declaration, queue, table, upstream, _DESCRIPTIONS[TRANSMISSION]))
    def transmission(context: AssetExecutionContext) -> MaterializeResult:
        with redacted_failures():
            before = ledger_versions(declaration, queue)
            result = transmit(declaration, queue, run_id=context.run.run_id)
            # Contract breaches dead-letter what waited here.
            for materialization in changed_ledgers(declaration, queue, before):
                context.log_event(materialization)
            for failure in result.failures:
                context.log.warning(f"{queue}: conversation {failure.conversation_id} to {failure.target} failed with "
                                    f"{failure.code} ({failure.description}): {failure.action}")
            return MaterializeResult(metadata={
                "delivered": MetadataValue.int(sum(result.delivered.values())),
                "waiting": MetadataValue.int(result.waiting),
                "resent_conversations": MetadataValue.int(result.resent),
                "failed_conversations": MetadataValue.int(len(result.failures)),
                "unsent_ended_conversation": MetadataValue.int(result.unsent),
            })

    return transmission


def queue_assets(declaration: Declaration, queue: str) -> list[AssetsDefinition]:
    """The flow inbound -> retry_1..N -> poison -> quarantine, with dead-letter and the ledger."""
    waiting = list(QueueTables.of(declaration, queue).waiting)
    main = waiting[:-1]
    factories: list[tuple[Callable[..., AssetsDefinition], str, list[str]]] = [
        (_cycle_asset, INBOUND, []),
        *((_cycle_asset, t, [main[i]]) for i, t in enumerate(main[1:])),
        (_cycle_asset, POISON, main),
        (_ledger_asset, QUARANTINE, waiting),
        (_ledger_asset, DEAD_LETTER, waiting),
        (_ledger_asset, PROCESSED, waiting),
        (_transmission_asset, TRANSMISSION, waiting),
    ]
    return [factory(declaration, queue, table, upstream) for factory, table, upstream in factories]
