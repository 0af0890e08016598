"""moto's S3 server with a fixed delay added to every request, as an S3 in the same region adds:
`python -m poison_pipeline_tests.delayed_s3 PORT DELAY_MS`. It logs each request as `moto.server`
does (benchmarks count them from that log)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any


def main(argv: list[str]) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    port, delay = int(argv[0]), float(argv[1]) / 1000
    app = DomainDispatcherApplication(create_backend_app)

    def delayed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        time.sleep(delay)
        return app(environ, start_response)  # type: ignore[no-any-return]

    run_simple("127.0.0.1", port, delayed, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1:])
