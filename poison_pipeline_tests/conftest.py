"""One local SparkSession for the whole run and a fresh lake root per test."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration
from poison_pipeline.engine.session import build_session
from poison_pipeline_tests import azure_support, s3_support
from poison_pipeline_tests.fuzz_support import COUNTS, active_profile, register_profiles
from poison_pipeline_tests.support import kill_seed

SPARK = SparkSettings(master="local[2]", config={"spark.sql.shuffle.partitions": "2"})
register_profiles()


def pytest_configure(config: Any) -> None:
    """The width the operator commands render their tables at, the same in a terminal, a pipe and a
    pytest-xdist worker (whose stdout is neither): `text/render.py` falls back to 160 columns."""
    os.environ["COLUMNS"] = "160"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its fuzz counts to the controller, which prints them."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["fuzz_counts"] = dict(COUNTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    COUNTS.update(getattr(node, "workeroutput", {}).get("fuzz_counts", {}))


def pytest_report_header(config: Any) -> str:
    return (f"kill campaigns: seed {kill_seed()} (KILL_SEED=N draws other points; the points a seed leaves out "
            "are marked `full`: make test-all runs them)")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the fuzz tests generated, so a run says how much it tried (`make fuzz` reports it); and,
    with $TEST_STAGE set (the Makefile's stages), the stage's result line (`stage_line`)."""
    stage_line(terminalreporter)
    if COUNTS:
        counted = ", ".join(f"{count:,} {kind}" for kind, count in sorted(COUNTS.items()))
        terminalreporter.write_line(f"fuzz ({active_profile()} profile): {counted}")


STAGES = Path(__file__).parent / "results" / "test_stages.jsonl"
_STARTED = time.time()
_LOAD_BEFORE = os.getloadavg()


def stage_line(terminalreporter: Any) -> None:
    """One JSON line per stage of `make test` / `make test-all` ($TEST_STAGE names it), appended to
    results/test_stages.jsonl: its seconds, its tests by outcome, the machine's load before and after,
    and its ten slowest tests (setup, call and teardown added up), so where the time goes is kept."""
    stage = os.environ.get("TEST_STAGE")
    if not stage or hasattr(terminalreporter.config, "workerinput"):
        return
    seconds: dict[str, float] = {}
    outcomes: dict[str, int] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        reports = terminalreporter.stats.get(outcome, [])
        outcomes[outcome] = len({r.nodeid for r in reports if r.when == "call" or outcome != "passed"})
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "duration", None) is not None and getattr(report, "nodeid", ""):
                seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
    slowest = sorted(seconds.items(), key=lambda item: -item[1])[:10]
    line = {"stage": stage, "seconds": round(time.time() - _STARTED, 1), "tests": outcomes,
            "workers": int(getattr(terminalreporter.config.option, "numprocesses", 0) or 0),
            "load_avg_before": [round(x, 2) for x in _LOAD_BEFORE],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()],
            "slowest": [[nodeid, round(took, 2)] for nodeid, took in slowest],
            "git_commit": _commit(), "at": datetime.now(UTC).isoformat(timespec="seconds")}
    STAGES.parent.mkdir(exist_ok=True)
    with STAGES.open("a") as stream:
        stream.write(json.dumps(line) + "\n")


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or "unknown"


# What a test of the engine room takes: Spark, a lake in its own folder, a store's server.
ENGINE_ROOM_FIXTURES = frozenset({"spark", "tmp_path", "tmp_path_factory", "make_declaration", "make_any_declaration",
                                  "s3_server", "azure_server"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes the engine room (Spark, a lake, a store: `ENGINE_ROOM_FIXTURES`) is marked
    `spark`, as is every end-to-end and model test, so `pytest -m "not spark"` runs the rest: the
    rules on plain values, in seconds. A test that reaches the engine room another way carries
    `pytest.mark.spark` itself."""
    for item in items:
        whole_product = item.get_closest_marker("e2e") or item.get_closest_marker("model")
        if whole_product or ENGINE_ROOM_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(SPARK)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The run's S3-compatible server (moto's on 127.0.0.1, started at its first use); the storage
    options that reach it. The caches a lake on a store keeps on this machine go to the run's own
    folder, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield from s3_support.serve()


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The run's Azure Storage emulator (Azurite's blob service on 127.0.0.1, started at its first
    use, its data in the run's own folder); the storage options that reach it. The caches a lake on
    a store keeps on this machine go to the run's own folder, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield from azure_support.serve(tmp_path_factory.mktemp("azurite"))


@pytest.fixture
def make_declaration(tmp_path: Path):
    """Build a declaration whose lake root is this test's own folder."""

    def build(queues: dict[str, Any], **settings: Any) -> Declaration:
        """`settings` are further top-level fields, e.g. small_cycles={"max_messages": 0}."""
        return parse_declaration(
            {"lake_root": str(tmp_path / "lake"), "spark": SPARK.model_dump(), "queues": queues, **settings}
        )

    return build


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.e2e)])
def make_any_declaration(request: pytest.FixtureRequest, make_declaration):
    """`make_declaration` for a lake in this test's folder, and (an e2e test) for one on the S3 server."""
    if request.param == "local":
        return make_declaration
    options = request.getfixturevalue("s3_server")

    def build(queues: dict[str, Any], **settings: Any) -> Declaration:
        # A commit to the local S3 server takes up to a second on a loaded machine: a lease expiring
        # sooner would expire while its holder renews it.
        settings["lease"] = {**settings.get("lease", {}), "expiry": "4s"}
        return make_declaration(queues, lake_root=s3_support.fresh_root(), storage_options=options, **settings)

    return build
