"""End to end (SPEC section 10): `dagster dev` shows the assets of a queue with their lineage, and
its sensors drive the inbound and retry cycles by themselves; headless Chromium renders the graph.

Nothing here launches a run: the daemon's sensors do, as they would for a person who only opened
the UI. The messages are the demo's orders: one succeeds on the inbound cycle, one on retry cycle
1 (its profile arrives in the meantime), one never does and is rejected to the dead-letter table,
which the failure sensor raises as one alert run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from poison_pipeline.defs.naming import alert_job_name, alert_sensor_name, job_name, sensor_name
from poison_pipeline.domain.alerts import MESSAGES_FAILED
from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.operations.conservation import conservation
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.status import queue_status
from poison_pipeline.storage.tables import QueueTables

pytestmark = [pytest.mark.e2e, pytest.mark.full]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LOCATION = "poison_pipeline"
REPOSITORY = "__repository__"  # the name Dagster gives a module's Definitions
QUEUE = "orders"
TABLES = ("inbound", "retry_1", "poison", "quarantine", "dead_letter", "processed", "transmission")
# message id -> where it must end: the ledger's disposition or a terminal table
MESSAGES = {
    "order-ok": ({"user": "ann", "profile": "exists"}, "processed"),
    "order-pending": ({"user": "bob", "profile": "pending"}, "processed"),
    "order-missing": ({"user": "cid", "profile": "missing"}, "dead_letter"),
}
STARTUP_TIMEOUT_S = 120
CYCLES_TIMEOUT_S = 360  # the retry sensor ticks every 60 s: a cycle slower than that costs a tick
ALERT_TIMEOUT_S = 120  # the failure sensor ticks every 30 s


_ORDERS = {QUEUE: {
    "handler": "poison_pipeline.examples.handlers:place_order",
    "policy": {
        "receive_retry_count": 0,
        "max_retry_cycles": 1,
        "retry_cycle_delay": "3s",
        "receive_error_handling": "reject",
    },
}}


def _declaration_file(tmp_path: Path, queues: dict[str, Any] | None = None) -> Path:
    """A declaration of `queues` (default: the orders queue) with a lake in tmp_path and a small Spark."""
    path = tmp_path / "poison_pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "lake_root": str(tmp_path / "lake"),
        "spark": {"master": "local[2]", "config": {"spark.sql.shuffle.partitions": "2"}},
        "queues": queues or _ORDERS,
    }))
    return path


def _dagster_home(tmp_path: Path) -> Path:
    """The repo's dagster.yaml, unchanged: its storage folders are relative, so dagster dev runs
    from the home folder as `make ui` does."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    return home


def _workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace.yaml"
    path.write_text(yaml.safe_dump({"load_from": [
        {"python_module": {"module_name": "poison_pipeline.definitions", "location_name": LOCATION}},
    ]}))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DagsterDev:
    """`dagster dev` in its own process group, its output in a log file."""

    def __init__(self, workspace: Path, home: Path, config: Path, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home),
            "POISON_PIPELINE_CONFIG": str(config),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(BIN / "dagster"), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(self.port)],
                cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n--- dagster dev log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.load(response)
        assert "errors" not in payload, f"GraphQL errors: {payload['errors']}{self.tail()}"
        return payload["data"]

    def wait_until(self, what: str, pending: Callable[[], str | None], timeout_s: float, every_s: float = 2.0) -> None:
        """Poll `pending` (what is still missing, None once there is nothing) until it returns None;
        fail with the log if dagster dev dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        last: str | None = "not checked yet"
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"dagster dev exited ({self.process.returncode}){self.tail()}"
            try:
                last = pending()
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                last = repr(error)
            if last is None:
                return
            time.sleep(every_s)
        pytest.fail(f"timed out after {timeout_s}s waiting for {what}; still: {last}{self.tail()}")

    def answers(self) -> str | None:
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=5) as response:
            return None if response.status == 200 else f"/server_info answered {response.status}"

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue


@contextmanager
def serving(tmp_path: Path, config: Path) -> Iterator[DagsterDev]:
    """`dagster dev` on the declaration file `config` ($POISON_PIPELINE_CONFIG), answering and with
    its code location loaded; stopped whatever happens, its log left in tmp_path."""
    server = DagsterDev(_workspace(tmp_path), _dagster_home(tmp_path), config, tmp_path / "dagster_dev.log")
    try:
        server.wait_until("the webserver", server.answers, STARTUP_TIMEOUT_S)
        server.wait_until("the code location to load", lambda: _location_pending(server), STARTUP_TIMEOUT_S)
        yield server
    finally:
        server.stop()


@pytest.fixture
def dagster_dev(tmp_path: Path) -> Iterator[tuple[DagsterDev, Declaration]]:
    """Messages enqueued first, then `dagster dev` on their declaration."""
    config = _declaration_file(tmp_path)
    declaration = load_declaration(config)
    records = [{"message_id": mid, "message_type": "order", "body": body} for mid, (body, _) in MESSAGES.items()]
    result = enqueue(declaration, QUEUE, records)
    assert result.accepted == len(MESSAGES) and not result.refused, result.refused
    with serving(tmp_path, config) as server:
        yield server, declaration


def _location_pending(server: DagsterDev) -> str | None:
    data = server.graphql("""{ workspaceOrError { __typename ... on Workspace { locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message stack } } } } } }""")
    entries = {e["name"]: e for e in data["workspaceOrError"].get("locationEntries", [])}
    entry = entries.get(LOCATION)
    if entry is None or entry["loadStatus"] != "LOADED":
        return f"location {LOCATION!r}: {entry and entry['loadStatus']}"
    error = entry["locationOrLoadError"]
    assert error["__typename"] == "RepositoryLocation", f"the code location failed to load: {error}{server.tail()}"
    return None


def _assert_lineage(server: DagsterDev) -> None:
    data = server.graphql("""query($group: AssetGroupSelector) { assetNodes(group: $group) {
        assetKey { path } dependencyKeys { path } groupName kinds jobNames } }""",
        {"group": {"groupName": QUEUE, "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}})
    nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
    assert set(nodes) == {f"{QUEUE}/{t}" for t in (*TABLES, "redrive", "redrive_group")}, \
        f"{sorted(nodes)}{server.tail()}"
    upstream = {key.split("/")[1]: {"/".join(d["path"]).split("/")[1] for d in n["dependencyKeys"]}
                for key, n in nodes.items()}
    assert upstream == {
        "inbound": set(),
        "retry_1": {"inbound"},
        "poison": {"inbound", "retry_1"},
        "quarantine": {"inbound", "retry_1", "poison"},
        "dead_letter": {"inbound", "retry_1", "poison"},
        "processed": {"inbound", "retry_1", "poison"},
        "transmission": {"inbound", "retry_1", "poison"},
        # Downstream of the failure tables, not upstream of the inbound it sends back to.
        "redrive": {"poison", "dead_letter", "quarantine"},
        "redrive_group": {"poison", "dead_letter", "quarantine"},
    }
    assert {"spark", "delta"} <= set(nodes[f"{QUEUE}/inbound"]["kinds"])
    assert job_name(QUEUE, "retry_1") in nodes[f"{QUEUE}/retry_1"]["jobNames"]


def _assert_sensors_running(server: DagsterDev) -> None:
    data = server.graphql("""query($repo: RepositorySelector!) { sensorsOrError(repositorySelector: $repo) {
        __typename ... on Sensors { results { name minIntervalSeconds sensorState { status }
        targets { pipelineName } } } ... on PythonError { message } } }""",
        {"repo": {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}})
    result = data["sensorsOrError"]
    assert result["__typename"] == "Sensors", result
    sensors = {s["name"]: s for s in result["results"]}
    for table in ("inbound", "retry_1", "poison"):
        sensor = sensors.get(sensor_name(QUEUE, table))
        assert sensor is not None, f"no sensor for {table}: {sorted(sensors)}"
        assert sensor["sensorState"]["status"] == "RUNNING", sensor
        assert [t["pipelineName"] for t in sensor["targets"]] == [job_name(QUEUE, table)], sensor


_RUNS = """{ runsOrError { __typename ... on Runs { results {
    runId jobName status tags { key value } } } } }"""
_UNFINISHED = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "MANAGED", "CANCELING"}


def _runs(server: DagsterDev) -> list[dict[str, Any]]:
    result = server.graphql(_RUNS)["runsOrError"]
    assert result["__typename"] == "Runs", result
    return result["results"]


def _alert_pending(server: DagsterDev, event_id: str) -> str | None:
    """What is missing of the failure alert run for `event_id`: launched, then finished."""
    for run in _runs(server):
        if {t["key"]: t["value"] for t in run["tags"]}.get("dagster/run_key") == event_id:
            return f"alert run {run['runId']} is {run['status']}" if run["status"] in _UNFINISHED else None
    return f"no alert run for event {event_id} yet"


def _places(declaration: Declaration) -> dict[str, str]:
    """message id -> its ledger disposition or the table it is in, read from the tables themselves."""
    tables = QueueTables.of(declaration, QUEUE)
    found = {}
    for row in tables.open("processed").to_pyarrow_table(columns=["message_id", "disposition"]).to_pylist():
        found[row["message_id"]] = row["disposition"]
    for table in ("dead_letter", "poison", "quarantine"):
        for row in tables.open(table).to_pyarrow_table(columns=["message_id"]).to_pylist():
            found[row["message_id"]] = table
    return found


def _cycles_pending(server: DagsterDev, declaration: Declaration) -> str | None:
    """What is missing before every message is terminal (by status and by conservation), a
    retry-cycle run has succeeded and no run is still going; a failed run fails at once."""
    runs = _runs(server)
    failed = [r for r in runs if r["status"] in ("FAILURE", "CANCELED")]
    assert not failed, f"runs did not succeed: {failed}{server.tail()}"
    summary = f"runs {sorted((r['jobName'], r['status']) for r in runs)}"
    status = queue_status(declaration, QUEUE, datetime.now(UTC))
    waiting = {t: status.table(t).rows for t in ("inbound", "retry_1")}
    if any(waiting.values()):
        return f"waiting {waiting}; {summary}"
    balance = conservation(QueueTables.of(declaration, QUEUE))
    if balance.accounted != len(MESSAGES) or balance.waiting:
        return f"{balance.line(len(MESSAGES))}; {summary}"
    if not any(r["jobName"] == job_name(QUEUE, "retry_1") and r["status"] == "SUCCESS" for r in runs):
        return f"no successful retry-cycle run yet; {summary}"
    if any(r["status"] in _UNFINISHED for r in runs):
        return f"a run is still going; {summary}"
    return None


class Browser:
    """Headless Debian Chromium on a `dagster dev`: waits on what the page shows, never on time, and
    fails with a screenshot, the page's text and the server's log."""

    def __init__(self, server: DagsterDev, folder: Path, width: int = 1600, height: int = 2400,
                 scale: float = 1.0) -> None:
        """A window of width x height CSS pixels; screenshots `scale` times that (small ones for docs)."""
        assert CHROMIUM.exists() and CHROMEDRIVER.exists(), (
            f"{CHROMIUM} and {CHROMEDRIVER} are required: run `make browser` (Debian: chromium chromium-driver)")
        self.server = server
        self.folder = folder
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={width},{height}", f"--force-device-scale-factor={scale}"):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
        self.driver.set_page_load_timeout(60)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            if kind is not None:
                self.shot("failure")
        finally:
            self.driver.quit()

    def open(self, path: str) -> None:
        self.driver.get(f"{self.server.url}{path}")

    def text(self) -> str:
        return str(self.driver.execute_script("return document.body ? document.body.innerText : ''"))

    def shot(self, name: str) -> Path:
        path = self.folder / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def fail(self, what: str, step: str) -> None:
        screenshot = self.shot(f"failure-{step}")
        # The page's markup beside its screenshot: what to look for when the UI's structure changed.
        (self.folder / f"failure-{step}.html").write_text(self.driver.page_source)
        pytest.fail(f"{what}; page text: {self.text()[:2000]!r}; screenshot: {screenshot}{self.server.tail()}")

    def wait(self, what: str, step: str, found: Callable[[], Any], timeout_s: float = 60) -> Any:
        """Wait until `found()` is truthy (and return it): `what` names it in the failure."""
        def attempt(_: object) -> Any:
            try:
                return found()
            except WebDriverException:  # an element re-rendered under us: look again
                return None

        try:
            return WebDriverWait(self.driver, timeout_s, poll_frequency=0.5).until(attempt)
        except TimeoutException:
            self.fail(f"timed out after {timeout_s}s waiting for {what}", step)

    def element(self, xpath: str, step: str, timeout_s: float = 60) -> Any:
        """The first displayed element at `xpath`, once there is one."""
        return self.wait(f"an element at {xpath}", step, lambda: next(
            (e for e in self.driver.find_elements(By.XPATH, xpath) if e.is_displayed() and e.is_enabled()), None),
            timeout_s)

    def click(self, xpath: str, step: str, timeout_s: float = 60) -> None:
        self.element(xpath, step, timeout_s).click()

    def dismiss_first_visit_dialogs(self, step: str) -> None:
        """Dagster greets a first visit on localhost with a newsletter dialog over the page: skip it
        when the server says it will show (a second visit does not)."""
        if self.server.graphql("{ shouldShowNux }")["shouldShowNux"]:
            self.click("//button[normalize-space(.)='Skip']", step)


def _assert_ui_renders_the_graph(server: DagsterDev, screenshot: Path) -> None:
    with Browser(server, screenshot.parent) as browser:
        browser.open(f"/locations/{LOCATION}/asset-groups/{QUEUE}/lineage")

        def missing_nodes() -> list[str]:
            """The tables that no element of the rendered graph is labelled with."""
            return [t for t in TABLES
                    if not browser.driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{t}']")]

        browser.wait(f"the asset graph of {QUEUE!r} to show every table", "graph", lambda: not missing_nodes())
        browser.dismiss_first_visit_dialogs("graph")
        browser.shot(screenshot.stem)


def test_dagster_dev_shows_lineage_and_sensors_drive_retry_cycles(dagster_dev, tmp_path: Path):
    server, declaration = dagster_dev

    _assert_lineage(server)
    _assert_sensors_running(server)
    _assert_ui_renders_the_graph(server, tmp_path / "asset_graph.png")

    server.wait_until("the sensors' runs to process every message",
                      lambda: _cycles_pending(server, declaration), CYCLES_TIMEOUT_S, every_s=3.0)

    assert _places(declaration) == {mid: place for mid, (_, place) in MESSAGES.items()}
    status = queue_status(declaration, QUEUE, datetime.now(UTC))
    assert status.table("dead_letter").by == {"rejected": 1}, status.table("dead_letter")
    assert status.table("processed").by == {"processed": 2}, status.table("processed")
    assert conservation(QueueTables.of(declaration, QUEUE)).accounted == len(MESSAGES)

    # The cycle that rejected order-missing to the dead-letter table is raised once, by the failure
    # sensor, with its event id as run key.
    events = QueueTables.of(declaration, QUEUE).open("events").to_pyarrow_table().to_pylist()
    [failed] = [e for e in events if e["kind"] == MESSAGES_FAILED]
    assert (failed["table"], json.loads(failed["failures"])[0]["count"]) == ("retry_1", 1), failed
    server.wait_until("the failure alert run", lambda: _alert_pending(server, failed["event_id"]), ALERT_TIMEOUT_S)

    runs = _runs(server)
    assert runs, f"no runs{server.tail()}"
    sensor_of = {job_name(QUEUE, t): sensor_name(QUEUE, t) for t in QueueTables.of(declaration, QUEUE).waiting}
    alerts = [run for run in runs if run["jobName"] == alert_job_name(QUEUE, MESSAGES_FAILED)]
    for run in runs:
        tags = {t["key"]: t["value"] for t in run["tags"]}
        assert run["status"] == "SUCCESS", f"{run}{server.tail()}"
        if run in alerts:
            assert tags.get("dagster/sensor_name") == alert_sensor_name(QUEUE, MESSAGES_FAILED), run
            continue
        # Only cycles ran, each launched by its table's sensor with a run key: nobody else launched any.
        assert tags.get("dagster/sensor_name") == sensor_of.get(run["jobName"], "(not a cycle job)"), run
        assert tags.get("dagster/run_key", "").startswith(f"{QUEUE}/"), run
    assert [{t["key"]: t["value"] for t in run["tags"]}["dagster/run_key"] for run in alerts] == [failed["event_id"]]
    jobs = {run["jobName"] for run in runs}
    assert {job_name(QUEUE, "inbound"), job_name(QUEUE, "retry_1")} <= jobs, jobs
