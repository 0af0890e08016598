"""End to end: an incident, worked from the Dagster UI alone in headless Chromium. Nine inventory
withdrawals fail for three causes and end in quarantine under `dagster dev`'s own sensors; the asset
graph shows quarantine's failing depth check; the quarantine asset's page shows the failure groups
with their error text and example ids; the operator fixes one cause, picks that group's partition of
`redrive_group`, launches a dry run (`would_move` right, nothing marked), then the redrive; the next
inbound cycle processes the group and the quarantine page no longer shows it, no one having
materialized anything by hand. Screenshots of each step are kept in the test's folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from poison_pipeline.defs.naming import redrive_group_asset_key
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.test_e2e_dagster_dev import LOCATION, Browser, DagsterDev, _declaration_file, serving
from poison_pipeline_tests.test_e2e_dagster_tour import add_config, finished_run, open_partitions_dialog, tags

pytestmark = pytest.mark.e2e

QUEUE = "inventory"
OP = f"{QUEUE}__redrive_group"
# Three causes: obsolete parts (unrecoverable), a unit the code mishandles (fixed during the
# incident), and quantities that are wrong.
CAUSES = {
    "PartObsolete": [{"part": f"OBS-{i}", "quantity": 1} for i in range(4)],
    "UnsupportedUnit": [{"part": f"P-{i}", "quantity": 2, "unit": "box"} for i in range(3)],
    "ValueError": [{"part": f"Q-{i}", "quantity": 0} for i in range(2)],
}
IDS = {cause: [f"w-{cause.lower()}-{i}" for i in range(len(bodies))] for cause, bodies in CAUSES.items()}


QUEUES = {QUEUE: {
    "handler": "poison_pipeline.examples.handlers:withdraw_inventory",
    "policy": {"receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "move",
               "unrecoverable": {"exceptions": ["poison_pipeline.examples.handlers:PartObsolete"]}},
    "poison_queue": {"handler": None},
}}


def quarantined(declaration: Any) -> set[str]:
    tables = QueueTables.of(declaration, QUEUE)
    if not tables.exists("quarantine"):
        return set()
    return {r["message_id"] for r in tables.open("quarantine").to_pyarrow_table(columns=["message_id"]).to_pylist()}


def processed(declaration: Any) -> set[str]:
    tables = QueueTables.of(declaration, QUEUE)
    if not tables.exists("processed"):
        return set()
    return {r["message_id"] for r in tables.open("processed").to_pyarrow_table(columns=["message_id"]).to_pylist()}


def versions(declaration: Any) -> dict[str, int]:
    tables = QueueTables.of(declaration, QUEUE)
    return {t: tables.open(t).version() for t in tables.all_tables if tables.exists(t)}


def group_of(declaration: Any, cause: str) -> str:
    [group] = {g.id for g in failure_groups(declaration, QUEUE, "quarantine") if g.error_type.endswith(cause)}
    return group


def materialized_partitions(server: DagsterDev) -> list[str]:
    data = server.graphql("""query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { __typename
        ... on Asset { assetMaterializations { partition } } } }""",
                          {"key": {"path": redrive_group_asset_key(QUEUE).path}})
    asset = data["assetOrError"]
    return [] if asset["__typename"] != "Asset" else [m["partition"] for m in asset["assetMaterializations"]]


def test_an_incident_worked_from_the_ui(spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app_db = tmp_path / "app_db"
    app_db.mkdir()
    (app_db / "inventory.unit-bug").touch()
    monkeypatch.setenv("POISON_PIPELINE_APP_DB", str(app_db))
    config = _declaration_file(tmp_path, QUEUES)
    declaration = load_declaration(config)
    records = [{"message_id": mid, "message_type": "inventory.withdrawal", "body": body}
               for cause, bodies in CAUSES.items() for mid, body in zip(IDS[cause], bodies, strict=True)]
    assert not enqueue(declaration, QUEUE, records).refused
    every = {mid for ids in IDS.values() for mid in ids}
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with serving(tmp_path, config) as server, Browser(server, shots, width=1600, height=1200, scale=0.75) as browser:
        # 1. The failures arrive: the sensors' inbound and poison cycles put all nine in quarantine.
        server.wait_until("the nine failures in quarantine", lambda: (
            None if quarantined(declaration) == every else f"quarantined: {sorted(quarantined(declaration))}"), 360)
        browser.open(f"/locations/{LOCATION}/asset-groups/{QUEUE}/lineage")
        browser.dismiss_first_visit_dialogs("1-graph")
        browser.wait("quarantine's depth check failing on the graph", "1-graph",
                     lambda: re.search(r"0 / 1 Passed", browser.text()) is not None)
        browser.shot("1-graph-failing-check")

        # 2. The quarantine asset's page: the groups, their error text and example ids.
        browser.open(f"/assets/{QUEUE}/quarantine")
        browser.wait("the failure groups with their errors and examples", "2-quarantine", lambda: all(
            s in browser.text() for s in ("failure_groups_top", "UnsupportedUnit", "PartObsolete",
                                          "quantity must be positive", IDS["UnsupportedUnit"][0])))
        browser.shot("2-quarantine-groups")

        # 3. The unit bug is fixed; a dry run of its group from the group's partition.
        (app_db / "inventory.unit-bug").unlink()
        group = group_of(declaration, "UnsupportedUnit")
        server.wait_until("the group's partition", lambda: None if group in _partitions(server) else
                          f"partitions: {_partitions(server)}", 120)
        before = versions(declaration)
        choose_group(browser, group, f"ops:\n  {OP}:\n    config:\n      dry_run: true\n", "3-dry-run")
        browser.shot("3-dry-run-dialog")
        browser.click("//button[normalize-space(.)='Launch 1 run']", "3-dry-run")
        finished_run(server, lambda r: _launched(r, group, dry_run="true"), "the dry run")
        browser.open(f"/assets/{'/'.join(redrive_group_asset_key(QUEUE).path)}?view=events&partition={group}")
        browser.wait("the dry run's would_move", "3-dry-run", lambda: "would_move" in browser.text()
                     and all(mid in browser.text() for mid in IDS["UnsupportedUnit"]))
        browser.shot("3-dry-run")
        assert versions(declaration) == before, "a dry run moved a table"
        assert materialized_partitions(server) == []

        # 4. The redrive itself; the inbound sensor's next cycle processes the group.
        choose_group(browser, group, f"ops:\n  {OP}:\n    config:\n      actor: on-call\n", "4-redrive")
        browser.click("//button[normalize-space(.)='Launch 1 run']", "4-redrive")
        run = finished_run(server, lambda r: _launched(r, group, dry_run="false"), "the redrive")
        assert tags(run)["poison_pipeline/actor"] == "on-call"
        assert materialized_partitions(server) == [group]
        server.wait_until("the group processed", lambda: None if set(IDS["UnsupportedUnit"]) <= processed(declaration)
                          else f"processed: {sorted(processed(declaration))}", 240)
        assert quarantined(declaration) == every - set(IDS["UnsupportedUnit"])

        # 5. The quarantine page is current: the group is gone, the other two stay.
        browser.open(f"/assets/{QUEUE}/quarantine")
        browser.wait("the quarantine page without the redriven group", "5-quarantine", lambda: (
            "PartObsolete" in browser.text() and "UnsupportedUnit" not in browser.text()))
        browser.shot("5-quarantine-after")


def choose_group(browser: Browser, group: str, config: str, step: str) -> None:
    """On the group redrive asset's page: pick `group` among its partitions, add config."""
    open_partitions_dialog(browser, redrive_group_asset_key(QUEUE).path, step)
    # Dynamic partitions are chosen from a list (the tag selector), not typed as a range.
    selector = "//div[@aria-haspopup][.//div[normalize-space(text())='Select a partition or create one']]"
    item = f"//*[@role='menuitem'][.//*[normalize-space(text())='{group}']]"

    def listed() -> Any:
        # The list opens on a click once the dialog has settled: click again until it shows.
        shown = [e for e in browser.driver.find_elements(By.XPATH, item) if e.is_displayed()]
        if not shown:
            for opener in browser.driver.find_elements(By.XPATH, selector):
                if opener.is_displayed() and opener.get_attribute("aria-expanded") != "true":
                    opener.click()
                    break
        return shown[0] if shown else None

    browser.wait(f"group {group} in the partitions list", step, listed).click()
    browser.driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    browser.wait("one partition selected", step, lambda: "1 partition" in browser.text())
    add_config(browser, config, step)


def _launched(run: dict[str, Any], group: str, dry_run: str) -> bool:
    """A run of the group's partition that knows whether it previews (`dry_run`: "true" or "false")."""
    seen = tags(run)
    return seen.get("dagster/partition") == group and seen.get("poison_pipeline/dry_run") == dry_run


def _partitions(server: DagsterDev) -> list[str]:
    data = server.graphql("""query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { __typename
        ... on AssetNode { partitionKeys } } }""", {"key": {"path": redrive_group_asset_key(QUEUE).path}})
    node = data["assetNodeOrError"]
    return node.get("partitionKeys") or []
