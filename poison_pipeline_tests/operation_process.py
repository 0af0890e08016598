"""Run one operator command in a process of its own and kill it with SIGKILL right after one of its
commit points: `python -m poison_pipeline_tests.operation_process CONFIG OPERATION STEP ARGS`.

OPERATION is redrive, edit, purge or undo; ARGS is the JSON of its arguments (`run_operation`). STEP
0 runs the command through and prints, as JSON, its result and every commit point it made, in
order; STEP N prints the Nth commit point and kills the process right after it. The tests call
`run_forked`, which runs the same `main` in a child forked from the model test's fork server (the
product imported once), so a kill point costs milliseconds to start, not the seconds of an import.

A commit point is anything a run killed right after leaves durable: a Delta commit to any table of
the lake (seen on disk, as a new `_delta_log` entry, whenever a call into delta-rs returns, so a
commit made through any Python path is caught; an operator plan is a commit to the queue's `plans`
table). The queue's `_lease` table is left out: its commits hold the lease,
not the command's work (a killed holder's lease simply expires), and its renewals come from a
thread of their own at times of their own. A Delta commit found only by the final look, after the
command returned, was made where no kill could be placed: it is listed as `unseen`, and the tests
require none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq

from poison_pipeline.domain.declaration import Declaration, load_declaration
from poison_pipeline.operations.edit import edit_message
from poison_pipeline.operations.purge import purge_table
from poison_pipeline.operations.redrive import redrive_table
from poison_pipeline.operations.selection import Selection
from poison_pipeline.operations.undo import undo_action
from poison_pipeline.storage.tables import ACTIONS

LEASE = "_lease"


def run_operation(declaration: Declaration, operation: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run the command as ARGS say (what the killed process ran, and what a test runs again), and
    return its result as JSON values."""
    now = datetime.fromisoformat(args["now"]) if "now" in args else None
    chosen = dict(args.get("selection", {}))
    if "ids" in chosen:
        chosen["ids"] = tuple(chosen["ids"])
    selection = Selection(**chosen)
    result: Any
    if operation == "redrive":
        result = redrive_table(declaration, args["queue"], args["source"], selection, rate=args.get("rate"),
                         redrive_id=args["id"], now=now)
    elif operation == "edit":
        result = edit_message(declaration, args["message_id"], args["body"].encode(), args.get("headers"),
                      edit_id=args["id"], now=now)
    elif operation == "purge":
        result = purge_table(declaration, args["queue"], args["table"], args["older_than"], selection,
                       purge_id=args["id"], now=now)
    elif operation == "undo":
        result = undo_action(declaration, args["id"], now=now)
    else:
        raise ValueError(f"operation {operation!r}: choose redrive, edit, purge or undo")
    return json.loads(json.dumps(asdict(result), default=lambda v: v.hex() if isinstance(v, bytes) else str(v)))


class CommitWatch:
    """Sees each commit point of the calling thread as it is made, and calls `on_commit(label)`."""

    def __init__(self, lake_root: str, on_commit: Callable[[str], None]) -> None:
        self.root = Path(lake_root)
        self.on_commit = on_commit
        self.points: list[str] = []
        self._versions = self._logs()

    def _logs(self) -> dict[Path, set[str]]:
        found: dict[Path, set[str]] = {}
        for log in self.root.glob("*/*/_delta_log"):
            if log.parent.name != LEASE:
                found[log] = {p.name for p in log.iterdir() if p.suffix == ".json" and p.stem.isdigit()}
        return found

    def _new_commits(self) -> list[str]:
        now = self._logs()
        labels = []
        for log, names in now.items():
            for name in sorted(names - self._versions.get(log, set())):
                labels.append(_label(log, name))
        self._versions = now
        return labels

    def _seen(self, label: str) -> None:
        self.points.append(label)
        self.on_commit(label)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and _from_delta_rs(arg):
            for label in self._new_commits():
                self._seen(label)

    def __enter__(self) -> CommitWatch:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def unseen(self) -> list[str]:
        """Delta commits made since the last one seen that no call into delta-rs returned after."""
        return self._new_commits()


def _from_delta_rs(called: Any) -> bool:
    owner = getattr(called, "__self__", None)
    module = getattr(called, "__module__", None) or type(owner).__module__
    return module.startswith("deltalake")


def _label(log: Path, name: str) -> str:
    """`queue/table OPERATION [mode] [txn app@version]`, from the commit's own log entry; for the actions
    ledger, also the action ids and states the commit wrote (begin, finish and undone look alike else).
    The lease's fence (`poison_pipeline/<queue>/fence` at the lease's epoch, storage/writer.py) is
    left out: a writer's commits all carry it, at an epoch that differs from run to run."""
    info: dict[str, Any] = {}
    txns, added = [], []
    for line in (log / name).read_text().splitlines():
        action = json.loads(line)
        info = action.get("commitInfo", info)
        if "txn" in action and not action["txn"]["appId"].endswith("/fence"):
            txns.append(f"{action['txn']['appId']}@{action['txn']['version']}")
        if "add" in action:
            added.append(log.parent / unquote(action["add"]["path"]))
    mode = (info.get("operationParameters") or {}).get("mode")
    parts = [f"{log.parent.parent.name}/{log.parent.name}", str(info.get("operation", "?"))]
    parts += [mode] if mode else []
    parts += [f"txn {t}" for t in txns]
    if log.parent.name == ACTIONS:
        for path in added:
            written = pq.read_table(path, columns=["action_id", "state"]).to_pylist()
            parts += [f"{r['action_id']}:{r['state']}" for r in written]
    return " ".join(parts)


def main(config: str, operation: str, step: str, args_json: str) -> None:
    declaration = load_declaration(config)
    kill_at = int(step)

    def on_commit(label: str) -> None:
        if len(watch.points) == kill_at:
            print(json.dumps({"killed_after": kill_at, "commit": label}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    watch = CommitWatch(declaration.lake_root, on_commit)
    with watch:
        result = run_operation(declaration, operation, json.loads(args_json))
    print(json.dumps({"result": result, "commits": watch.points, "unseen": watch.unseen()}), flush=True)


def _forked_main(out: str, err: str, *argv: str) -> None:
    """The body of a forked child: `main`, its output to the files the parent reads."""
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's own stdout
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    main(*argv)


def run_forked(config: str, operation: str, step: int, args: dict[str, Any],
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m poison_pipeline_tests.operation_process ...` as a child of the warm fork server:
    its exit code (-9 when killed), stdout and stderr, as `subprocess.run` would give them."""
    from poison_pipeline_tests.model_support import warm_context

    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
        child = warm_context().Process(target=_forked_main,
                                       args=(out, err, config, operation, str(step), json.dumps(args)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(f"{operation} {step}", timeout)
        return subprocess.CompletedProcess([operation, str(step)], child.exitcode,
                                           Path(out).read_text(), Path(err).read_text())


if __name__ == "__main__":
    main(*sys.argv[1:5])
