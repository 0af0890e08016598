"""One local SparkSession for the whole run and a fresh lake root per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from poison_pipeline.domain.declaration import Declaration, SparkSettings, parse_declaration
from poison_pipeline.engine.session import build_session
from poison_pipeline_tests import azure_support, s3_support
from poison_pipeline_tests.fuzz_support import COUNTS, active_profile, register_profiles

SPARK = SparkSettings(master="local[2]", config={"spark.sql.shuffle.partitions": "2"})
register_profiles()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the fuzz tests generated, so a run says how much it tried (`make fuzz` reports it)."""
    if COUNTS:
        counted = ", ".join(f"{count:,} {kind}" for kind, count in sorted(COUNTS.items()))
        terminalreporter.write_line(f"fuzz ({active_profile()} profile): {counted}")


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
