"""The Spark resource: one lazily built session per run, shared by every step of that run."""

from dagster_pyspark import LazyPySparkResource

from poison_pipeline.domain.declaration import SparkSettings
from poison_pipeline.engine.session import build_session


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy session, built by the engine so workers share the driver's venv."""

    master: str = "local[*]"
    remote: str | None = None
    app_name: str = "poison_pipeline"

    @classmethod
    def from_settings(cls, settings: SparkSettings) -> "SparkResource":
        return cls(
            master=settings.master,
            remote=settings.remote,
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
