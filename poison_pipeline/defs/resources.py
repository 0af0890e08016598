"""The Spark resource: one lazily built session per run, shared by every step of that run."""

from __future__ import annotations

import os

from dagster import InitResourceContext
from dagster_pyspark import LazyPySparkResource

from poison_pipeline.domain.declaration import SparkSettings
from poison_pipeline.engine.session import build_session, shared_session

# A running Spark Connect server for every run of this deployment, instead of the declaration's
# master: `make ui` sets it to the server it starts beside `dagster dev`.
REMOTE_ENV = "POISON_PIPELINE_SPARK_REMOTE"


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, built by the engine so workers share the driver's venv."""

    master: str = "local[*]"
    remote: str | None = None
    app_name: str = "poison_pipeline"

    @classmethod
    def from_settings(cls, settings: SparkSettings) -> SparkResource:
        return cls(
            master=settings.master,
            remote=os.environ.get(REMOTE_ENV) or settings.remote,
            app_name=settings.app_name,
            spark_config=dict(settings.config),
        )

    def _init_session(self) -> None:
        if self._spark_session is None:
            settings = SparkSettings(
                master=self.master, remote=self.remote, app_name=self.app_name,
                config={k: str(v) for k, v in self.spark_config.items()},
            )
            self._spark_session = build_session(settings)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        # A run's own Connect session is released so the server frees it (and its Python workers);
        # a shared one is kept for the next run. An embedded session ends with the run's process.
        if self._spark_session is not None and self.remote and not shared_session(self.remote):
            self._spark_session.stop()
