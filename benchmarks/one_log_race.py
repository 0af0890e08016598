"""One log per queue, measured before the layout changes: can every move of a message be one commit
to one Delta table while lease-free appends race the cycles and an operator?

    .venv/bin/python benchmarks/one_log_race.py [--stores local,s3,azure] [--seconds S] [--history N] [--quick]

Per store, a table `messages` partitioned by `place`, and these writers at once, each on a thread of
its own, none holding a lease:

- **producers** append batches of new messages to `inbound` (`mode="append"`) under an app
  transaction each; a refused commit is retried from a fresh snapshot, and the app transaction says
  whether an earlier try landed after all;
- **two cycles per waiting place** (inbound, retry_1, poison; a run and its zombie twin, neither
  knowing of the other) take the batches their snapshot holds there and commit their whole
  outcome as ONE `write_deltalake(mode="overwrite", predicate=...)`: the taken batches leave the
  place and their rows land where the outcome sends them (processed, retry_1, poison, quarantine),
  tagged with the cycle's app transaction; refused, it is retried the same way;
- **an operator** redrives quarantine into inbound with the same one commit.

Each mover pauses for a random time (up to `--pause-ms`) between its read and its commit, as any
process may: what it read may be stale by then, and only what the store accepts keeps it right.

The predicate names the taken batches by a range of their time-ordered ids and by the list (a list
alone defeats delta-rs's file statistics beyond about twenty values, and every commit conflicts);
the new rows' side names their own new batch ids, which delta-rs requires the written rows to match.

Then every version of the table is read: each message appended is in exactly one place at every
version from its append on, and at the end every message a producer's commit landed is there
(from the producers' own record, not the table's). Then the cost of loading a table with `--history`
commits (checkpoints every 100, as delta-rs writes them): open it and read one place, on the local
disk and on the S3 server, with its request count.

One JSON line: per store, commits landed and refused per writer, the most retries one commit needed,
the versions checked, the violations (must be 0), and the load figures.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from cycle_throughput import emit  # noqa: E402
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake  # noqa: E402
from deltalake.exceptions import CommitFailedError  # noqa: E402

from poison_pipeline_tests import azure_support, s3_support  # noqa: E402

SCHEMA = pa.schema([("message_id", pa.string()), ("batch_id", pa.string()), ("place", pa.string()),
                    ("attempts", pa.int32()), ("body", pa.string())])
WAITING = ("inbound", "retry_1", "poison")
# Retries of one commit before the writer gives up and the run says so.
MAX_TRIES = 200


def new_batch_id() -> str:
    """Time-ordered, unique: a range of them is a range of files in delta-rs's statistics."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def _quoted(values: list[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def outcome(place: str, message_id: str, attempts: int) -> str:
    """Where a delivery from `place` sends the message: fixed by its id, as a handler's verdict is."""
    roll = zlib.crc32(f"{message_id}/{attempts}".encode()) % 10
    if place == "inbound":
        return "processed" if roll < 8 else ("retry_1" if roll == 8 else "poison")
    if place == "retry_1":
        return "processed" if roll < 5 else "poison"
    return "quarantine"


@dataclass
class Tally:
    landed: int = 0
    refused: int = 0
    most_tries: int = 0
    gave_up: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, tries: int) -> None:
        self.landed += 1
        self.refused += tries - 1
        self.most_tries = max(self.most_tries, tries)


class Store:
    """Where the table lives: its uri and the storage options that reach it."""

    def __init__(self, name: str, uri: str, options: dict[str, str] | None) -> None:
        self.name, self.uri, self.options = name, uri, options

    def open(self, version: int | None = None) -> DeltaTable:
        return DeltaTable(self.uri, version=version, storage_options=self.options)


def committed(store: Store, app_id: str, version: int) -> bool:
    """Whether the commit of `app_id` at `version` landed (the answer to a refused or lost reply)."""
    landed = store.open().transaction_version(app_id)
    return landed is not None and landed >= version


def commit(store: Store, tally: Tally, app_id: str, version: int, attempt: Callable[[DeltaTable], bool]) -> bool:
    """Run `attempt` on fresh snapshots until its commit lands (or it has nothing to do: False)."""
    for tries in itertools.count(1):
        if tries > MAX_TRIES:
            tally.gave_up += 1
            return False
        try:
            if not attempt(store.open()):
                return False
            tally.add(tries)
            return True
        except CommitFailedError as refused:
            tally.errors[str(refused)[:80]] += 1
            if committed(store, app_id, version):
                tally.add(tries)
                return True
            time.sleep(random.uniform(0, 0.02 * min(tries, 10)))
    raise AssertionError("unreachable")


def produce(store: Store, name: str, stop: threading.Event, tally: Tally, landed: list[str], batch: int) -> None:
    app_id = f"producer/{name}"
    for n in itertools.count(1):
        if stop.is_set():
            return
        ids = [f"{name}-{n}-{k}" for k in range(batch)]
        rows = pa.table({"message_id": ids, "batch_id": [new_batch_id()] * batch, "place": ["inbound"] * batch,
                         "attempts": pa.array([0] * batch, pa.int32()), "body": ["{}"] * batch}, schema=SCHEMA)

        def append(_: DeltaTable, rows: pa.Table = rows, n: int = n) -> bool:
            write_deltalake(store.uri, rows, mode="append", storage_options=store.options,
                            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, n)]))
            return True

        if commit(store, tally, app_id, n, append):
            landed.extend(ids)


def move(store: Store, name: str, source: str, stop: threading.Event, tally: Tally, largest: int,
         pause: float, where_to: Callable[[str, int], str]) -> None:
    """Take the batches of `source` in each snapshot and put their rows where `where_to` says, in one commit."""
    app_id = f"mover/{name}"
    for n in itertools.count(1):
        if stop.is_set():
            return

        def attempt(table: DeltaTable, n: int = n) -> bool:
            rows = table.to_pyarrow_table(filters=[("place", "=", source)])
            taken = sorted(set(rows.column("batch_id").to_pylist()))[:largest]
            if not taken:
                return False
            rows = rows.filter(pc.is_in(rows.column("batch_id"), pa.array(taken)))
            attempts = [a + 1 for a in rows.column("attempts").to_pylist()]
            places = [where_to(m, a) for m, a in zip(rows.column("message_id").to_pylist(), attempts, strict=True)]
            new = {place: new_batch_id() for place in sorted(set(places))}
            moved = pa.table({"message_id": rows.column("message_id"), "batch_id": [new[p] for p in places],
                              "place": places, "attempts": pa.array(attempts, pa.int32()),
                              "body": rows.column("body")}, schema=SCHEMA)
            # A writer may pause for any time between its read and its write: what it read is stale by then.
            time.sleep(random.uniform(0, pause))
            predicate = (f"(place = '{source}' AND batch_id >= '{taken[0]}' AND batch_id <= '{taken[-1]}' "
                         f"AND batch_id IN ({_quoted(taken)})) OR (place IN ({_quoted(list(new))}) "
                         f"AND batch_id IN ({_quoted(list(new.values()))}))")
            # Committed against the snapshot read (not the table's latest version): the conflict checker
            # then refuses the commit if another removed what was read since.
            write_deltalake(table, moved, mode="overwrite", predicate=predicate,
                            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, n)]))
            return True

        if not commit(store, tally, app_id, n, attempt):
            time.sleep(0.05)  # nothing waits there now


def check_versions(store: Store, first: int, landed: set[str]) -> dict[str, Any]:
    """Every version from `first` on: each message in one place, none gone once it was there; at the
    end, every message whose append landed."""
    seen: set[str] = set()
    doubled = vanished = 0
    last = store.open().version()
    for version in range(first, last + 1):
        ids = store.open(version).to_pyarrow_table(columns=["message_id"]).column("message_id")
        counts = pc.value_counts(ids)
        doubled += int(pc.sum(pc.greater(counts.field("counts"), 1)).as_py() or 0)
        present = set(ids.to_pylist())
        vanished += len(seen - present)
        seen = present
    missing = len(landed - seen)
    return {"versions_checked": last - first + 1, "in_two_places": doubled, "vanished": vanished,
            "appended_but_missing": missing, "violations": doubled + vanished + missing}


def race(store: Store, seconds: float, producers: int, batch: int, largest: int, pause: float) -> dict[str, Any]:
    write_deltalake(store.uri, SCHEMA.empty_table(), mode="error", partition_by=["place"],
                    storage_options=store.options)
    first = store.open().version()
    stop = threading.Event()
    tallies: dict[str, Tally] = {}
    landed: list[str] = []
    threads = []
    for k in range(producers):
        tallies[f"producer{k}"] = Tally()
        threads.append(threading.Thread(target=produce, args=(store, f"p{k}", stop, tallies[f"producer{k}"],
                                                              landed, batch)))
    # Two cycles of each place at once (a run and its zombie twin): the store must refuse one of any
    # two that took the same batch.
    for place, twin in itertools.product(WAITING, range(2)):
        name = f"cycle_{place}_{twin}"
        tallies[name] = Tally()
        threads.append(threading.Thread(target=move, args=(
            store, name, place, stop, tallies[name], largest, pause,
            lambda m, a, place=place: outcome(place, m, a))))
    tallies["operator_redrive"] = Tally()
    threads.append(threading.Thread(target=move, args=(store, "redrive", "quarantine", stop,
                                                       tallies["operator_redrive"], largest, pause,
                                                       lambda m, a: "inbound")))
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=600)
    stuck = sum(t.is_alive() for t in threads)
    wall = time.perf_counter() - started
    checked = check_versions(store, first, set(landed))
    places = Counter(store.open().to_pyarrow_table(columns=["place"]).column("place").to_pylist())
    return {"seconds": round(wall, 1), "stuck_writers": stuck, "messages": len(landed), "places": dict(places),
            "writers": {name: {"landed": t.landed, "refused": t.refused, "most_tries": t.most_tries,
                               "gave_up": t.gave_up, "refusals": dict(t.errors.most_common(3))}
                        for name, t in tallies.items()},
            **checked}


def long_history(folder: Path, commits: int) -> Path:
    """A local table with `commits` one-batch moves in its log (a checkpoint every 100)."""
    path = folder / "history"
    write_deltalake(str(path), SCHEMA.empty_table(), mode="error", partition_by=["place"])
    # One table object throughout: each commit goes on from the state the last one left, without
    # listing a log of thousands of entries again.
    table = DeltaTable(str(path))
    for n in range(1, commits):
        place = WAITING[n % 3] if n % 10 else "poison"
        rows = pa.table({"message_id": [f"h{n}"], "batch_id": [new_batch_id()], "place": [place],
                         "attempts": pa.array([0], pa.int32()), "body": ["{}"]}, schema=SCHEMA)
        write_deltalake(table, rows, mode="append")
    return path


def load_cost(store: Store) -> dict[str, float]:
    started = time.perf_counter()
    table = store.open()
    opened = time.perf_counter()
    table.to_pyarrow_table(filters=[("place", "=", "poison")])
    read = time.perf_counter()
    return {"open_ms": round((opened - started) * 1000, 1), "read_poison_ms": round((read - opened) * 1000, 1)}


def upload(folder: Path, put: Callable[[str, bytes], None]) -> None:
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            put(file.relative_to(folder).as_posix(), file.read_bytes())


@contextlib.contextmanager
def stores(names: list[str], folder: Path) -> Iterator[dict[str, tuple[Callable[[str], Store], Any]]]:
    """Each store asked for: a maker of fresh table locations in it, and what uploads a local table."""
    with contextlib.ExitStack() as stack:
        made: dict[str, tuple[Callable[[str], Store], Any]] = {}
        if "local" in names:
            made["local"] = (lambda name: Store("local", str(folder / name), None), None)
        if "s3" in names:
            log = str(folder / "s3_requests.log")
            s3_options = stack.enter_context(contextlib.contextmanager(s3_support.serve)(log=log))
            made["s3"] = (lambda name: Store("s3", f"s3://{s3_support.BUCKET}/{name}", s3_options),
                          (s3_options, log))
        if "azure" in names:
            azure_folder = folder / "azurite"
            azure_folder.mkdir()
            az_options = stack.enter_context(contextlib.contextmanager(azure_support.serve)(azure_folder))
            made["azure"] = (lambda name: Store("azure", f"az://{azure_support.CONTAINER}/{name}", az_options),
                             (az_options, None))
        yield made


def _s3_put(options: dict[str, str], prefix: str) -> Callable[[str, bytes], None]:
    import boto3

    client = boto3.client("s3", endpoint_url=options["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    return lambda key, data: client.put_object(Bucket=s3_support.BUCKET, Key=f"{prefix}/{key}", Body=data)


def _lines(log: str) -> int:
    """Requests the S3 server has logged (one line each)."""
    with open(log) as lines:
        return sum(1 for _ in lines)


def compute(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    root = Path(folder)
    result: dict[str, Any] = {"benchmark": "one_log_race", "seconds": args.seconds, "producers": args.producers,
                              "batch": args.batch, "largest_take": args.largest, "pause_ms": args.pause_ms,
                              "history_commits": args.history,
                              "load_avg_before": list(os.getloadavg()), "stores": {}}
    with stores(args.stores, root) as made:
        races = {name: race(make("race"), args.seconds, args.producers, args.batch, args.largest,
                            args.pause_ms / 1000) for name, (make, _) in made.items()}
        started = time.perf_counter()
        history = long_history(root, args.history) if args.history else None
        result["history_build_s"] = round(time.perf_counter() - started, 1)
        for name, (make, extra) in made.items():
            figures = races[name]
            if history is not None:
                if name == "local":
                    figures["history"] = load_cost(Store("local", str(history), None))
                elif name == "s3":
                    options, log = extra
                    upload(history, _s3_put(options, "history"))
                    before = _lines(log)
                    figures["history"] = load_cost(make("history"))
                    figures["history"]["requests"] = _lines(log) - before
            result["stores"][name] = figures
    result["violations"] = sum(s["violations"] for s in result["stores"].values())
    result["load_avg_after"] = list(os.getloadavg())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", type=lambda text: text.split(","), default=["local", "s3", "azure"])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the writers race, per store")
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=20, help="messages per append")
    parser.add_argument("--largest", type=int, default=20, help="batches one move takes at most")
    parser.add_argument("--pause-ms", type=float, default=100.0,
                        help="a mover's longest pause between its read and its commit (a random one each time)")
    parser.add_argument("--history", type=int, default=10_000, help="commits of the table whose load is timed")
    parser.add_argument("--quick", action="store_true", help="local disk, 8 s, 300 commits of history")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.quick:
        args.stores, args.seconds, args.history = ["local"], 8.0, 300
    found: dict[str, Any] = {}

    def run(folder: str) -> dict[str, Any]:
        found.update(compute(args, folder))
        return found

    emit(run, args.workdir, "one_log_race-")
    # A message lost or doubled fails the run (and `make bench-quick`), whatever the figures.
    return 1 if found.get("violations") or any(s["stuck_writers"] for s in found["stores"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
