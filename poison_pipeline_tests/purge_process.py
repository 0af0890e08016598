"""Run a purge in a process of its own and kill it with SIGKILL right after one durable step:
`python -m poison_pipeline_tests.purge_process CONFIG STEP NOW` (STEP: begin, plan, ledger, remove,
finish; NOW: ISO 8601). The purge deletes q's withdrawals in poison older than 30d, id `p1`."""

from __future__ import annotations

import os
import signal
import sys
from datetime import datetime
from typing import Any

from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations import purge as purge_module
from poison_pipeline.operations.selection import Selection
from poison_pipeline.storage.tables import QueueTables

TARGETS = {"begin": (purge_module, "begin_action"), "plan": (purge_module, "write_plan"),
           "ledger": (QueueTables, "append"), "remove": (QueueTables, "replace_batches"),
           "finish": (purge_module, "finish_action")}


def main(config: str, step: str, now: str) -> None:
    owner, name = TARGETS[step]
    original = getattr(owner, name)

    def then_die(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if name != "append" or args[1] == "purged":  # the actions ledger's own appends go through
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, then_die)
    purge_module.purge(load_declaration(config), "q", "poison", "30d", Selection(message_type="withdrawal"),
                       purge_id="p1", now=datetime.fromisoformat(now))
    print("not killed", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
