"""Building the Spark session a run uses: embedded local[*], a master URL, or Spark Connect."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from poison_pipeline.domain.declaration import SparkSettings

# Settings the engine relies on: microsecond UTC timestamps that Delta readers understand, and
# Arrow batches for the handler UDF. Users may override anything else.
REQUIRED = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.sql.sources.partitionOverwriteMode": "static",
    # A cycle names every due file (the Delta log lists them): a table fed by many small enqueues
    # hands Spark thousands. Above this many paths Spark would check them in a listing job of one
    # task per path (seconds for 500); on the driver a local file costs a stat.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    # What Spark charges per file when it packs files into tasks (its default, 4 MiB, made 500
    # files of 10 messages 16 tasks, each paying a handler's set-up): a small file costs about as
    # much as reading 64 KiB, so small files pack into about as many tasks as the cores.
    "spark.sql.files.openCostInBytes": "65536",
}


# An embedded driver has no other machine to talk to: it listens on loopback only (Spark would
# otherwise bind every interface and advertise the machine's address).
LOCAL_DEFAULTS = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


def session_config(settings: SparkSettings) -> dict[str, str]:
    """The Spark configuration a session of `settings` runs with (also a Connect server's)."""
    local = LOCAL_DEFAULTS if settings.remote is None and settings.master.startswith("local") else {}
    return {**DEFAULTS, **local, **settings.config, **REQUIRED}


def shared_session(remote: str) -> bool:
    """Whether a Spark Connect URL names its server-side session (`;session_id=...`): the
    processes using it share that session, its Python workers and their warm imports."""
    return any(part.strip().startswith("session_id=") for part in remote.split(";")[1:])


def build_session(settings: SparkSettings) -> SparkSession:
    """Return the session for `settings`; workers run this interpreter so they see the same venv.

    On Spark Connect only the SQL settings are the session's own: the others (memory, UI) were
    fixed when the server started (`local_servers.start_connect_server` starts it with them)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(settings.app_name)
    builder = builder.remote(settings.remote) if settings.remote else builder.master(settings.master)
    for key, value in session_config(settings).items():
        if settings.remote is None or key.startswith("spark.sql."):
            builder = builder.config(key, value)
    return builder.getOrCreate()


def cores(spark: SparkSession) -> int | None:
    """The cores the session's executors have, where it knows them (a Spark Connect client does not)."""
    context = getattr(spark, "sparkContext", None)
    return None if context is None else int(context.defaultParallelism)
