"""A small cycle that stops its whole process group (SIGSTOP) at one exact point, as a GC pause or a
frozen VM would: `python -m poison_pipeline_tests.pausing_cycle CONFIG QUEUE TABLE K`.

K > 0: right before the K-th storage write of the queue's writer, after its fence was checked (the
worst moment: a process that believed it held the lease). K = 0: the handler (`paused_handler`)
stops the group while it delivers the message whose body names a `pause_once` file. Prints `STOPPING` first and,
at the end, `REFUSED <error>` or `COMMITTED`."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from deltalake import DeltaTable

from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.domain.envelope import Message
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage import writer as writer_module
from poison_pipeline.storage.lease import LeaseLost
from poison_pipeline_tests.recording_handlers import append_line

_writes = 0


def _stop(what: str) -> None:
    print(f"STOPPING {what}", flush=True)
    os.killpg(os.getpgid(0), signal.SIGSTOP)


def paused_handler(message: Message) -> None:
    """Logs each call (id, pid) to the body's `log`; stops its process group while delivering a
    message whose body names a `pause_once` file that exists (removed first: it stops once)."""
    body = message.json()
    append_line(body["log"], {"id": message.message_id, "pid": os.getpid()})
    flag = body.get("pause_once")
    if flag and os.path.exists(flag):
        os.remove(flag)
        _stop(f"delivering {message.message_id}")


def _pausing(original: Callable[..., Any], stop_at: int) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        global _writes
        _writes += 1
        if _writes == stop_at:
            _stop(f"before write #{stop_at}")
        return original(*args, **kwargs)
    return wrapped


def main(config: str, queue: str, table: str, stop_at: int) -> None:
    if stop_at:
        # Every way the writer reaches the storage, counted together in call order.
        writer_module.write_deltalake = _pausing(writer_module.write_deltalake, stop_at)  # type: ignore[attr-defined]
        for name in ("create_write_transaction", "delete", "restore"):
            setattr(DeltaTable, name, _pausing(getattr(DeltaTable, name), stop_at))

    def no_spark() -> Any:
        raise AssertionError("small cycles only")

    try:
        run_cycle(no_spark, load_declaration(config), queue, table, run_id="paused")
    except LeaseLost as error:
        print(f"REFUSED {type(error).__name__}: {error}", flush=True)
        return
    print("COMMITTED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
