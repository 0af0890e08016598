"""The soak's fast profile: `benchmarks/soak.py` (what `make soak` runs for 30 minutes) for one
minute on two example queues under `dagster dev`, whose sensors launch the cycles while messages
arrive every 3 s, the inventory database goes down and comes back, a cycle run is killed with
SIGKILL while it holds its queue's lease, and a second and third starter (an asset-page launch
and a script beside Dagster) start the cycle of a queue whose run is inside its cycle.

Afterwards every message must be accounted for (the queues' conservation and one_place checks and
the intake against what was enqueued) and the application's own record of deliveries must show
each message delivered once, except the deliveries of a run that failed or was killed before it
committed (the README: its messages are delivered again, receivers are idempotent by id).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.full]

REPO = Path(__file__).resolve().parents[1]


def test_a_minute_of_soak_with_a_kill_an_outage_and_concurrent_starts_loses_and_repeats_nothing(tmp_path: Path):
    command = [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--seconds", "60",
               "--queues", "inventory,orders", "--drain-seconds", "0", "--workdir", str(tmp_path), "--no-record"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.terminate()  # the soak stops dagster dev and its runs on SIGTERM
            out, err = process.communicate(timeout=180)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line (exit {process.returncode}):\n{err[-5000:]}"
    result = json.loads(lines[-1])
    context = f"{json.dumps(result, indent=1)}\n--- soak log ---\n{(tmp_path / 'soak.log').read_text()}"

    # What the soak made happen.
    assert result["kills"] >= 1 and result["kills_holding_lease"] >= 1, context
    assert result["outages_detected"] >= 1 and result["outages_recovered"] == result["outages"] >= 1, context
    assert result["concurrent_dagster"]["tried"] >= 1 and result["concurrent_outside"]["tried"] >= 1, context
    assert result["messages_enqueued"] > 0 and result["deliveries"] > 0, context

    # Nothing lost, nothing in two places, nothing left waiting.
    assert result["accepted_by_queue"] == result["enqueued_by_queue"], context
    assert result["conservation_ok"] and result["one_place_ok"], context
    assert result["left_waiting"] == {}, context
    # Nothing delivered twice outside the README's allowance, every processed message delivered and
    # every delivered one processed.
    assert result["duplicates_outside_allowance"] == 0, context
    assert result["delivered_not_processed"] == [] and result["processed_not_delivered"] == [], context
    # Every concurrent start finished or failed cleanly (busy); no run failed for another reason.
    assert result["concurrent_dagster"]["unclean"] == [] and result["concurrent_outside"]["unclean"] == [], context
    assert result["unexplained_run_failures"] == [], context
    # No run failed, and no enqueue was refused, because a commit lost a race to a concurrent one.
    assert result["runs_failed_on_commit_conflict"] == [] and result["enqueue_commit_conflicts"] == 0, context
    assert result["correct"], context
