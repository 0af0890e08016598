"""A lake on an object store: one that cannot be reached (no such bucket, no route to the endpoint)
fails every command at once with an error naming the store and what to check, never the
credentials, and writes nothing; one that can holds every message once through an operator's
sequence and through processes killed at random commit points. The store is the test run's S3
server (`s3_server`, conftest)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from poison_pipeline.operations.checks import check_one_place
from poison_pipeline.operations.records import enqueue
from poison_pipeline.storage import column_cache
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests import model_support as ms
from poison_pipeline_tests import store_scenarios
from poison_pipeline_tests.s3_support import BUCKET, fresh_root
from poison_pipeline_tests.support import kill_seed

pytestmark = pytest.mark.e2e
SECRET = "wrong-but-secret-7f3a"
KEY_ID, TOKEN, PASSWORD = "AKIASECRETKEYID7F3A", "secret-session-token-7f3a", "proxy-password-7f3a"


@pytest.mark.parametrize("case, said", [
    ("no such bucket", "the bucket or container of lake_root does not exist on the store (bucket 'missing-"),
    ("no route to the endpoint", "the store cannot be reached (endpoint http://127.0.0.1:1, bucket "
                                 f"'{BUCKET}'): check storage_options.AWS_ENDPOINT_URL"),
    # A proxy's password in the endpoint's userinfo: the endpoint is named, the password never.
    ("no route to an endpoint with a password", "the store cannot be reached (endpoint http://***@127.0.0.1:1, "
                                                f"bucket '{BUCKET}'): check storage_options.AWS_ENDPOINT_URL"),
])
@pytest.mark.parametrize("command", ["enqueue", "status"])
def test_an_unreachable_store_fails_naming_it_and_writes_nothing(s3_server: dict[str, str], tmp_path: Path,
                                                                case: str, said: str, command: str) -> None:
    options = {**s3_server, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN}
    root = lake = fresh_root("unreachable")
    if case == "no such bucket":
        lake = root.replace(f"s3://{BUCKET}/", f"s3://missing-{tmp_path.name.lower()[-20:]}/")
    elif case == "no route to the endpoint":
        options["AWS_ENDPOINT_URL"] = "http://127.0.0.1:1"
    else:
        options["AWS_ENDPOINT_URL"] = f"http://proxyuser:{PASSWORD}@127.0.0.1:1"
    store_scenarios.fails_naming_the_store(tmp_path, command, lake, options, said,
                                           secrets=[KEY_ID, SECRET, TOKEN, PASSWORD])
    # Nothing was written where the lake would be, on the reachable store.
    assert store_scenarios.written_under(root, s3_server) == []


def test_poison_a_redrive_its_undo_and_a_purge_on_an_s3_lake_keep_every_message_once(
        make_declaration, s3_server: dict[str, str]) -> None:
    """The operator's sequence on a lake on the S3 server (small cycles, no Spark): each message is
    in one place after every step and the books balance."""
    store_scenarios.operator_sequence(make_declaration, fresh_root("operator"), s3_server)


def test_the_one_place_check_on_an_s3_lake_reads_only_the_files_it_has_not_read_before(
        make_declaration, s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its copy of what it read is kept on this machine: a check's requests follow what changed
    since the last one, not the queue's history."""
    declaration = make_declaration({"q": {"handler": "poison_pipeline_tests.handlers:accept"}},
                                   lake_root=fresh_root("checks"), storage_options=s3_server)
    tables = QueueTables.of(declaration, "q")
    for i in range(3):
        enqueue(declaration, "q", [{"message_id": f"m{i}", "message_type": "t", "body": {}}])
    real, read = column_cache._read_files, []

    def spy(uri: str, options: dict[str, str], files: list[tuple[str, int]], schema: Any) -> Any:
        read.append((uri.rsplit("/", 1)[1], len(files)))
        return real(uri, options, files, schema)

    monkeypatch.setattr(column_cache, "_read_files", spy)
    assert check_one_place(tables).passed
    assert read == [("inbound", 3)]
    read.clear()
    assert check_one_place(tables).passed
    assert read == []
    enqueue(declaration, "q", [{"message_id": "m3", "message_type": "t", "body": {}}])
    found = check_one_place(tables)
    assert read == [("inbound", 1)] and found.metadata["ids_checked"] == 4


def test_killed_at_random_commit_points_on_an_s3_lake_nothing_is_lost_and_nothing_doubled(
        s3_server: dict[str, str], tmp_path: Path) -> None:
    """Cycles, redrives, purges and undos, each killed (SIGKILL) right after a commit point drawn at
    random, then run again, on a lake on the S3 server: after each, every message the test enqueued
    is in exactly one place (a waiting or failure table, the processed or purged ledger), the
    queue's books balance and no action is left half done. `make test` draws the same points every
    time (a CI run fails for a change, not a draw); `KILL_SEED` draws others, and the seed is in every
    failure message."""
    seed = kill_seed()
    rng = random.Random(seed)
    config = ms.write_declaration(tmp_path, expiry=ms.STORE_EXPIRY_SECONDS, store=(fresh_root("kills"), s3_server))
    accepted: Counter[str] = Counter()

    def send(ids: list[str], fail: str) -> None:
        lines = ms.lines_for(tmp_path, ids, fail)
        done = json.loads(ms.run_op(str(config), "enqueue", {"queue": "qc", "lines": lines}))
        assert done["refused"] == []
        accepted.update(ids)

    def in_poison() -> list[str]:
        return ms.ids_in(config, "qc", "poison")

    send(["a1", "a2", "a3"], "always")
    send(["n1", "n2"], "never")
    killed = 0
    for round_ in range(8):
        op = rng.choice(("cycle", "cycle", "redrive", "purge", "undo"))
        args: dict[str, Any]
        if op == "cycle":
            args = {"queue": "qc", "table": rng.choice(("inbound", "poison"))}
        elif op == "redrive":
            args = {"queue": "qc", "source": "poison", "id": f"r{round_}"}
        elif op == "purge":
            chosen = in_poison()[:1]
            args = {"queue": "qc", "table": "poison", "older_than": 0, "id": f"p{round_}",
                    **({"selection": {"ids": chosen}} if chosen else {})}
        else:
            done = [a for a in ms.actions(config) if a.state == "done" and not a.action_id.endswith("--undo")]
            if not done:
                op, args = "cycle", {"queue": "qc", "table": "inbound"}
            else:
                args = {"id": done[-1].action_id}
        at = rng.randint(1, ms.USUAL_POINTS[op])
        child = ms.start_child(config, op, args, "kill", at)
        child.finish()
        killed += child.killed()
        said = f"seed {seed}, round {round_}: {op} {args} killed after commit point {at} ({child.outcome()})"
        # The same command again (it waits out the dead holder's lease), then the queue's cycles.
        ms.run_op(str(config), op, {**args, "run_id": "again"} if op == "cycle" else args)
        for table in ("inbound", "poison"):
            ms.run_op(str(config), "cycle", {"queue": "qc", "table": table})
        where = ms.places(config)
        assert {m: len(where.get(m, [])) for m in accepted} == dict(accepted), f"{said}: {dict(where)}"
        assert set(where) == set(accepted), said
        (received, accounted, line) = ms.product_lines(config)["qc"]
        assert received == accounted == sum(accepted.values()), f"{said}: {line}"
        assert {a.action_id: a.state for a in ms.actions(config) if a.state == "planned"} == {}, said
        if round_ == 3:
            send([f"a{round_}"], "always")
    assert killed, f"seed {seed}: no run was killed (each ended before its drawn commit point)"
