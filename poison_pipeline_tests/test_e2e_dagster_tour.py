"""End to end: the operator's tour of `dagster dev` in headless Chromium (issue 9). The asset graph
shows the checks a cycle ran; a backfill over two of three failure days, launched from the redrive
asset's partitions dialog with config, redrives exactly those days; a dry run of the third shows
what would move and changes no table; `enable` from the Launchpad resumes the queue.

The failures are written before `dagster dev` starts, by cycles run at three past moments (the
cycle takes `now`), so each day's messages carry that day in `dead_lettered_at`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from poison_pipeline.defs.naming import job_name, operator_job_name, operator_op_name, redrive_asset_key
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.operations.actions import list_actions
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.test_e2e_dagster_dev import (
    LOCATION,
    QUEUE,
    Browser,
    DagsterDev,
    _declaration_file,
    _runs,
    serving,
)

pytestmark = pytest.mark.e2e

NOW = datetime.now(UTC)
# Three failure days, oldest first: the backfill takes the first two, the dry run the third.
FAILED = [NOW.replace(hour=10, minute=0, second=0, microsecond=0) - timedelta(days=ago) for ago in (3, 2, 1)]
DAYS = [d.strftime("%Y-%m-%d") for d in FAILED]
IDS = {day: [f"{day}-{user}" for user in ("ann", "bob")] for day in DAYS}
RUN_TIMEOUT_S = 180
ACTOR = "tour-operator"
REDRIVE_OP = f"{QUEUE}__redrive"  # the redrive asset's op: the Launchpad's `ops:` key


@pytest.fixture
def failure_days(spark, tmp_path: Path) -> tuple[Path, Declaration]:
    """Two orders rejected to dead_letter on each of three days, then one fresh order waiting, so
    `dagster dev`'s inbound sensor runs a cycle (and with it the checks) as soon as it starts."""
    config = _declaration_file(tmp_path)
    declaration = load_declaration(config)
    for day, moment in zip(DAYS, FAILED, strict=True):
        records = [{"message_id": mid, "message_type": "order", "body": {"user": mid, "profile": "missing"}}
                   for mid in IDS[day]]
        assert not enqueue(declaration, QUEUE, records, now=moment).refused
        # Inbound, then retry cycle 1 (a minute later: past retry_cycle_delay), rejects to dead_letter.
        for minute, table in enumerate(("inbound", "retry_1")):
            run_cycle(spark, declaration, QUEUE, table, now=moment + timedelta(minutes=minute))
    assert dead_letter_days(declaration) == {mid: day for day in DAYS for mid in IDS[day]}
    fresh = {"message_id": "order-ok", "message_type": "order", "body": {"user": "cid", "profile": "exists"}}
    assert not enqueue(declaration, QUEUE, [fresh]).refused
    return config, declaration


def dead_letter_days(declaration: Declaration) -> dict[str, str]:
    """message id -> the day it was dead-lettered, read from the table."""
    rows = QueueTables.of(declaration, QUEUE).open("dead_letter").to_pyarrow_table(
        columns=["message_id", "dead_lettered_at"]).to_pylist()
    return {r["message_id"]: r["dead_lettered_at"].strftime("%Y-%m-%d") for r in rows}


def inbound_ids(declaration: Declaration) -> set[str]:
    rows = QueueTables.of(declaration, QUEUE).open("inbound").to_pyarrow_table(columns=["message_id"]).to_pylist()
    return {r["message_id"] for r in rows}


def versions(declaration: Declaration) -> dict[str, int]:
    tables = QueueTables.of(declaration, QUEUE)
    return {t: tables.open(t).version() for t in tables.all_tables if tables.exists(t)}


def finished_run(server: DagsterDev, pick: Any, what: str) -> dict[str, Any]:
    """The one run `pick(run)` accepts, once it has finished; it must have succeeded."""
    found: dict[str, Any] = {}

    def pending() -> str | None:
        runs = [r for r in _runs(server) if pick(r)]
        if len(runs) != 1 or runs[0]["status"] not in ("SUCCESS", "FAILURE", "CANCELED"):
            return f"{what}: {[(r['runId'], r['status']) for r in runs]}"
        found.update(runs[0])
        return None

    server.wait_until(what, pending, RUN_TIMEOUT_S)
    assert found["status"] == "SUCCESS", f"{what}: {found}{server.tail()}"
    return found


def tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def give_config(browser: Browser, yaml_text: str, step: str) -> None:
    """Write the run config into the open config editor (CodeMirror, as typing into it does) and
    wait for Dagster to validate it."""
    browser.element("//div[contains(@class,'CodeMirror')]", step)
    browser.driver.execute_script(
        "document.querySelector('.CodeMirror').CodeMirror.setValue(arguments[0])", yaml_text)
    browser.wait("the config editor to find no errors", step, lambda: "No errors" in browser.text())


def open_partitions_dialog(browser: Browser, asset: list[str], step: str) -> None:
    """On `asset`'s page: open the partitions dialog ("Materialize…")."""
    browser.open(f"/assets/{'/'.join(asset)}")
    browser.click("//button[normalize-space(.)='Materialize…']", step)
    # The failure tables upstream may never have been materialized: Dagster asks first.
    dialog = browser.wait("the partitions dialog (or the upstream warning)", step, lambda: (
        "Partition selection" in browser.text() or "Are you sure?" in browser.text()))
    assert dialog
    if "Are you sure?" in browser.text():
        browser.click("//button[normalize-space(.)='Confirm']", step)


def add_config(browser: Browser, config: str, step: str) -> None:
    """In the open partitions dialog: add the launch's config and save it."""
    browser.click("//*[normalize-space(text())='Config']", step)
    browser.click("//button[normalize-space(.)='Add config']", step)
    give_config(browser, config, step)
    browser.click("//button[normalize-space(.)='Save config']", step)
    browser.wait("the config editor to close and the dialog to say the config is saved", step, lambda: (
        "Config saved" in browser.text()
        and not browser.driver.find_elements(By.XPATH, "//*[normalize-space(text())='Config Editor']")))


def choose_partitions(browser: Browser, selection: str, config: str, step: str) -> None:
    """On the redrive asset's page: open the partitions dialog, type the partitions, add config."""
    open_partitions_dialog(browser, redrive_asset_key(QUEUE).path, step)
    partitions = browser.element("//input[@placeholder='No matching partitions']", step)
    partitions.send_keys(selection + "\n")
    add_config(browser, config, step)


def test_the_operator_tour_in_a_browser(failure_days, tmp_path: Path) -> None:
    config, declaration = failure_days
    tables = QueueTables.of(declaration, QUEUE)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with serving(tmp_path, config) as server, Browser(server, shots, width=1600, height=1200, scale=0.75) as browser:
        # 1. The inbound cycle the sensor launches runs the checks; the graph shows them passed, but
        # for dead_letter's depth: six failed messages sit there, a warning (yellow) until they leave.
        finished_run(server, lambda r: r["jobName"] == job_name(QUEUE, "inbound"), "the sensor's inbound cycle")
        browser.open(f"/locations/{LOCATION}/asset-groups/{QUEUE}/lineage")
        browser.dismiss_first_visit_dialogs("1-asset-graph")

        def checks_shown() -> list[tuple[int, int]] | None:
            counts = [(int(a), int(b)) for a, b in re.findall(r"(\d+) / (\d+) Passed", browser.text())]
            # inbound 4 (conservation, one_place, user_code, oldest_waiting), poison 3 (growth, oldest_waiting,
            # depth), retry_1 1, quarantine 1 (depth), dead_letter 1 of 2 (growth passed, depth failed)
            return counts if sorted(counts) == [(1, 1), (1, 1), (1, 2), (3, 3), (4, 4)] else None

        browser.wait("every check of the graph but dead_letter's depth to show passed", "1-asset-graph", checks_shown)
        browser.shot("1-asset-graph")

        # An outage (or an operator) disabled the queue: what is redriven waits in the inbound.
        set_enabled(tables, False, "ops", "profile service down")

        # 2. A backfill over the first two days, with config, from the partitions dialog.
        choose_partitions(browser, f"[{DAYS[0]}...{DAYS[1]}]", f"ops:\n  {REDRIVE_OP}:\n    config:\n"
                          f"      source_tables: [dead_letter]\n      actor: {ACTOR}\n", "2-backfill")
        browser.wait("2 partitions selected", "2-backfill", lambda: "2 partitions" in browser.text())
        browser.shot("2-backfill-dialog")
        browser.click("//button[normalize-space(.)='Launch backfill']", "2-backfill")
        run = finished_run(server, lambda r: "dagster/backfill" in tags(r), "the backfill's run")
        backfill = tags(run)["dagster/backfill"]
        browser.open(f"/runs/b/{backfill}")
        browser.wait("the backfill page to show it succeeded", "2-backfill",
                     lambda: "100% completed" in browser.text() and "Succeeded" in browser.text())
        browser.shot("2-backfill")

        # One run for the range; exactly the two days' messages are back in the inbound.
        assert (tags(run)["dagster/asset_partition_range_start"],
                tags(run)["dagster/asset_partition_range_end"]) == (DAYS[0], DAYS[1]), run
        assert inbound_ids(declaration) == set(IDS[DAYS[0]] + IDS[DAYS[1]])
        assert dead_letter_days(declaration) == {mid: DAYS[2] for mid in IDS[DAYS[2]]}
        [redrive] = [a for a in list_actions(declaration, QUEUE) if a.kind == "redrive"]
        assert (redrive.actor, redrive.run_id, redrive.counts["moved"]) == (ACTOR, run["runId"], 4), redrive

        # 3. A dry run of the third day: its metadata on the page, no table moved.
        before = versions(declaration)
        choose_partitions(browser, DAYS[2], f"ops:\n  {REDRIVE_OP}:\n    config:\n      dry_run: true\n",
                          "3-dry-run")
        browser.click("//button[normalize-space(.)='Launch 1 run']", "3-dry-run")
        dry = finished_run(server, lambda r: tags(r).get("dagster/partition") == DAYS[2], "the dry run")
        browser.open(f"/assets/{'/'.join(redrive_asset_key(QUEUE).path)}?view=events&partition={DAYS[2]}")
        browser.wait("the dry run's metadata", "3-dry-run", lambda: all(
            s in browser.text() for s in ("dry_run", "by_group", "by_message_type", "sample_ids", *IDS[DAYS[2]])))
        browser.shot("3-dry-run")
        assert versions(declaration) == before, "a dry run moved a table"
        assert dead_letter_days(declaration) == {mid: DAYS[2] for mid in IDS[DAYS[2]]}
        assert dry["runId"] not in {a.run_id for a in list_actions(declaration, QUEUE)}

        # 4. `enable` from the Launchpad, with typed config.
        assert not queue_state(tables).enabled
        enable_job = operator_job_name(QUEUE, "enable")
        browser.open(f"/locations/{LOCATION}/jobs/{enable_job}/playground")
        give_config(browser, f"ops:\n  {operator_op_name(QUEUE, 'enable')}:\n    config:\n"
                    f"      reason: profile service is back\n      actor: {ACTOR}\n", "4-enable")
        browser.shot("4-enable-launchpad")
        browser.click("//button[normalize-space(.)='Launch Run']", "4-enable")
        enabled = finished_run(server, lambda r: r["jobName"] == enable_job, "the enable run")
        browser.wait("the run page to show the run succeeded", "4-enable",
                     lambda: enabled["runId"][:8] in browser.text() and "Success" in browser.text())
        browser.shot("4-enable-run")
        state = queue_state(tables)
        assert state.enabled and state.actor == ACTOR, state
        [action] = [a for a in list_actions(declaration, QUEUE) if a.kind == "enable"]
        assert (action.actor, action.run_id, action.arguments["reason"]) == (
            ACTOR, enabled["runId"], "profile service is back"), action
