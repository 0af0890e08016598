"""Driving the sensors by hand, as the Dagster daemon would: evaluate each, run what it requests."""

from __future__ import annotations

import json
import time
from typing import Any

from dagster import DagsterInstance, Definitions, SensorResult, build_sensor_context

from poison_pipeline.defs.naming import ALERT_TAG

QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
SILENT = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def _print_materializations(outcome: Any) -> None:
    for event in outcome.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        meta = {k: v.value for k, v in materialization.metadata.items()}
        if "failed_messages" in meta and "messages" not in meta:  # a ledger the cycle wrote to
            print(f"  {materialization.asset_key.to_user_string():<26} rows={meta['rows']:>6} "
                  f"failure groups={meta['failure_groups']}")
            continue
        if "delivered" in meta:
            print(f"  {materialization.asset_key.to_user_string():<26} delivered={meta['delivered']:>5} "
                  f"waiting={meta['waiting']:>5} resent conversations={meta['resent_conversations']}")
            continue
        print(f"  {materialization.asset_key.to_user_string():<26} messages={meta.get('messages', 0):>6} "
              f"attempts={meta.get('attempts', 0):>6} processed={meta.get('processed', 0):>6} "
              f"moved={meta.get('moved', 0):>5} {meta.get('duration_s', 0):6.1f}s"
              + (f"  ({meta['skipped']})" if meta.get("skipped") else ""))


class Driver:
    """Keeps every sensor's cursor between calls, so each `drive` continues where the last stopped."""

    def __init__(self, defs: Definitions, instance: DagsterInstance) -> None:
        self.defs = defs
        self.instance = instance
        self.cursors: dict[str, str | None] = {}

    def drive(self, queues: list[str] | None = None, seconds: float = 240) -> int:
        """Evaluate the sensors (of `queues`, default all) and run what they request, until nothing
        waits or time is up."""
        deadline = time.monotonic() + seconds
        runs = 0
        sensors = [s for s in self.defs.get_repository_def().sensor_defs
                   if queues is None or s.name.split("__", 1)[0] in queues]
        while time.monotonic() < deadline:
            launched, waiting = 0, False
            for sensor in sensors:
                context = build_sensor_context(instance=self.instance, cursor=self.cursors.get(sensor.name),
                                               definitions=self.defs, sensor_name=sensor.name)
                result = sensor(context)
                assert isinstance(result, SensorResult)
                self.cursors[sensor.name] = result.cursor
                cursor = json.loads(result.cursor or "{}")
                waiting = waiting or bool(cursor.get("waiting") and not cursor.get("disabled"))
                for request in result.run_requests or []:
                    launched += 1
                    self._run(str(request.job_name or sensor.job_name), request)
            runs += launched
            if not launched and not waiting:
                return runs
            if not launched:
                time.sleep(0.5)
        return runs

    def _run(self, job_name: str, request: Any) -> None:
        job = self.defs.resolve_job_def(job_name)
        alert = ALERT_TAG in (request.tags or {})
        # A queue_disabled alert run fails by design: its failure is printed below, not as an error log.
        config = {**(SILENT if alert else QUIET), **(request.run_config or {})}
        outcome = job.execute_in_process(instance=self.instance, tags=request.tags, run_config=config,
                                         raise_on_error=not alert)
        if alert:
            failures = outcome.get_step_failure_events()
            error = failures[0].step_failure_data.error if failures else None
            outputs = [e.step_output_data.metadata for e in outcome.all_events if e.is_successful_output]
            message = error.message.strip() if error else outputs[0]["event"].value if outputs else "alert"
            print(f"  ALERT run {job_name}: {message}")
            return
        assert outcome.success, f"{job_name} failed"
        _print_materializations(outcome)
