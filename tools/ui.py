"""`make ui`: `dagster dev` with a Spark Connect server beside it, so a run launched from the UI
connects to a warm Spark instead of starting a JVM of its own.

The server is started from pyspark's own script with the declaration's Spark settings, listens on
localhost only, and is stopped by its process id when `dagster dev` ends (Ctrl-C, SIGTERM, or a
failure). Every run of this deployment shares one server-side session ($POISON_PIPELINE_SPARK_REMOTE
names it), so the Python workers stay warm between runs. A declaration that already names a
`remote` server is used as it is. `dagster dev` logs warnings and errors only (sensor ticks are in
the UI); `--log-level info` brings back a line per tick. Usage: python tools/ui.py [dagster dev options]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from poison_pipeline.defs.resources import REMOTE_ENV
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.engine.local_servers import start_connect_server


def main(args: list[str]) -> int:
    # A shell that starts this in the background ignores SIGINT, and so would dagster dev, which
    # stops on SIGINT (SIGTERM too, through the same handler): give it back its default.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    declaration = load_declaration()
    env = dict(os.environ)
    # The webserver on localhost only, whatever dagster's default becomes; `-h HOST` still chooses.
    host = [] if {"-h", "--host", "--dagit-host"} & {a.split("=")[0] for a in args} else ["--host", "127.0.0.1"]
    # The daemon logs every sensor tick at info (thousands in half an hour): warnings and errors only,
    # unless `--log-level` is given; ticks and runs are in the UI (Automation, Runs).
    quiet = [] if "--log-level" in {a.split("=")[0] for a in args} else ["--log-level", "warning"]
    dagster = [str(Path(sys.executable).with_name("dagster")), "dev", "-w", "workspace.yaml", *host, *quiet, *args]
    if declaration.spark.remote:
        return subprocess.call(dagster, env=env)
    print("starting a Spark Connect server for the runs (localhost only)...", flush=True)
    server = start_connect_server(declaration.spark, Path.cwd() / ".spark_connect", pythonpath=[os.getcwd()])
    try:
        env[REMOTE_ENV] = server.session_url()
        print(f"Spark Connect server at {server.url} (pid {server.process.pid}, log {server.process.log})",
              flush=True)
        ui = subprocess.Popen(dagster, env=env)
        # SIGTERM (from make, a supervisor) ends dagster dev as Ctrl-C would; the server stops below.
        signal.signal(signal.SIGTERM, lambda signum, frame: ui.send_signal(signal.SIGINT))
        while True:
            try:
                return ui.wait()
            except KeyboardInterrupt:  # Ctrl-C reached dagster dev too: wait for it to finish
                continue
    finally:
        print(f"stopping the Spark Connect server (pid {server.process.pid})", flush=True)
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
