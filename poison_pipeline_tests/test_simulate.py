"""Policy simulation: the recorded attempts replayed under a candidate policy, without Spark."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline.cli import main
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.domain.policy import Policy
from poison_pipeline.domain.simulation import Fates, Tried, replay
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.records import enqueue
from poison_pipeline.operations.simulate import simulate
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.support import HANDLER, places

FAIL = Tried(True, 0.5)
OK = Tried(False, 0.25)


def test_a_replay_follows_the_candidates_counts_and_says_what_it_assumed():
    fixed = Policy(receive_retry_count=1, max_retry_cycles=1, retry_cycle_delay=timedelta(seconds=30))
    # Processed at the fourth attempt: two per cycle, one delay between.
    fate = replay(fixed, "m", [FAIL, FAIL, FAIL, OK], finished=True)
    assert (fate.outcome, fate.attempts, fate.seconds, fate.assumed) == (Fates.PROCESSED, 4, 30 + 1.75, 0)
    # Fewer attempts: the success is never reached.
    strict = Policy(receive_retry_count=0, max_retry_cycles=0, receive_error_handling="reject")
    assert replay(strict, "m", [FAIL, FAIL, FAIL, OK], finished=True).outcome is Fates.DEAD_LETTERED
    # More attempts than were made: those that never happened fail as the last one did...
    generous = Policy(receive_retry_count=4, max_retry_cycles=0, receive_error_handling="move")
    fate = replay(generous, "m", [FAIL, FAIL], finished=True)
    assert (fate.outcome, fate.attempts, fate.assumed) == (Fates.POISONED, 5, 3)
    # ... unless the message still waits for them: then it waits.
    assert replay(generous, "m", [FAIL, FAIL], finished=False).outcome is Fates.WAITING


def test_a_replay_applies_rules_unrecoverable_and_the_backoff():
    policy = Policy.model_validate({
        "receive_retry_count": 2, "max_retry_cycles": 2, "receive_error_handling": "move",
        "backoff": {"initial": "10s", "multiplier": 3},
        "rules": [{"exceptions": ["LookupError"], "receive_retry_count": 0, "receive_error_handling": "reject"}],
        "unrecoverable": {"codes": ["BAD"], "route": "quarantine"}})
    looked_up = Tried(True, 0.0, rule=0)
    fate = replay(policy, "m", [looked_up] * 9, finished=True)
    assert (fate.outcome, fate.attempts, fate.seconds) == (Fates.DEAD_LETTERED, 3, 10 + 30)
    assert replay(policy, "m", [Tried(True, 0.0, unrecoverable=True)], finished=True).outcome is Fates.QUARANTINED


QUEUE = {"handler": HANDLER, "policy": {"receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0,
                                        "receive_error_handling": "move"}}
BODIES: dict[str, dict[str, Any]] = {
    "ok-1": {}, "ok-2": {}, "ok-3": {},
    "bad": {"fail": True},                      # always fails: 4 attempts, then poison
    "deadlock": {"fail_until_attempt": 2},      # processed at its second attempt
    "late": {"fail_until_cycle": 1},            # processed in retry cycle 1
    "unfixable": {"unfixable": True},           # code UNFIXABLE: fails like bad
}


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Queue q after its inbound and retry cycles, and `waiting` in retry_1 after its inbound cycle."""
    folder = tmp_path_factory.mktemp("simulate")
    config = folder / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": QUEUE}}))
    declaration = load_declaration(str(config))
    records = [{"message_id": m, "message_type": "refund" if m == "late" else "order", "body": b}
               for m, b in BODIES.items()]
    assert not enqueue(declaration, "q", records).refused
    now = datetime.now(UTC)
    run_cycle(spark, declaration, "q", "inbound", now=now)
    run_cycle(spark, declaration, "q", "retry_1", now=now + timedelta(seconds=1))
    assert not enqueue(declaration, "q", [{"message_id": "waiting", "message_type": "order",
                                           "body": {"fail": True}}]).refused
    run_cycle(spark, declaration, "q", "inbound", now=now + timedelta(seconds=2))
    assert places(declaration)["waiting"] == ["retry_1"]
    return config


def test_the_policy_actually_used_reproduces_the_recorded_outcomes_exactly(lake: Path):
    declaration = load_declaration(str(lake))
    found = simulate(declaration, "q", declaration.queue("q").policy)
    assert found.changed == 0
    assert found.simulated == found.recorded == {"processed": 5, "poisoned": 2, "waiting": 1}
    assert found.messages == 8
    recorded_attempts = QueueTables.of(declaration, "q").open("attempts").to_pyarrow_table().num_rows
    assert found.attempts == recorded_attempts
    for row in found.rows:
        assert row.simulated == row.recorded, row
        assert row.assumed == 0
    by_key = {(r.message_type, r.group == "-"): r for r in found.rows}
    assert by_key[("order", True)].messages == 3 and by_key[("order", True)].attempts_mean == 1


def test_a_stricter_candidate_rejects_what_was_retried_and_quarantines_a_code(lake: Path):
    declaration = load_declaration(str(lake))
    candidate = Policy.model_validate({
        "receive_retry_count": 0, "max_retry_cycles": 0, "receive_error_handling": "reject",
        "unrecoverable": {"codes": ["UNFIXABLE"], "route": "quarantine"}})
    found = simulate(declaration, "q", candidate)
    assert found.simulated == {"processed": 3, "dead_lettered": 4, "quarantined": 1}
    # bad, deadlock, late and unfixable end elsewhere; `waiting` too (dead-lettered, no longer waiting).
    assert found.changed == 5
    assert sum(r.assumed for r in found.rows) == 0


def test_a_more_generous_candidate_fills_attempts_that_never_happened_by_assumption(lake: Path):
    declaration = load_declaration(str(lake))
    candidate = Policy.model_validate({"receive_retry_count": 3, "max_retry_cycles": 1,
                                       "receive_error_handling": "move", "backoff": {"initial": "1m"}})
    found = simulate(declaration, "q", candidate)
    # bad and unfixable: 8 attempts where 4 were made, poisoned all the same; `waiting` has had 2 of
    # its first cycle's 4 and still waits.
    assert found.simulated == {"processed": 5, "poisoned": 2, "waiting": 1}
    assumed = {r.group: r.assumed for r in found.rows if r.simulated.get("poisoned")}
    assert sum(assumed.values()) == 2
    poisoned = [r for r in found.rows if r.simulated.get("poisoned")]
    assert all(r.attempts_mean == 8 and r.seconds_max >= 60 for r in poisoned)


def test_the_cli_prints_the_report_and_its_json_and_refuses_a_bad_policy_file(lake: Path, tmp_path: Path, capsys):
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(yaml.safe_dump({"policy": {"receive_retry_count": 0, "max_retry_cycles": 0,
                                                    "receive_error_handling": "reject"}}))
    assert main(["--config", str(lake), "simulate", "--policy", str(candidate), "--queue", "q", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["simulated"] == {"processed": 3, "dead_lettered": 5}
    assert report["recorded"] == {"processed": 5, "poisoned": 2, "waiting": 1}
    assert any("never happened" in text for text in report["assumptions"])
    assert main(["--config", str(lake), "simulate", "--policy", str(candidate)]) == 0
    text = capsys.readouterr().out
    assert "queue q: 8 messages" in text and "dead_lettered 5" in text and "assumed:" in text

    versions = {t: QueueTables.of(load_declaration(str(lake)), "q").open(t).version() for t in ("attempts", "poison")}
    for content, says in [({"backoff": {"initial": "1m", "multiplier": -1}}, "backoff.multiplier = -1"),
                          ({"backoff": {"initial": "10m", "max": "1m"}}, "max (60s) is below initial (600s)"),
                          ("policy: [unclosed", "is not valid YAML"),
                          ({"retry_count": 3}, "retry_count")]:
        candidate.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        assert main(["--config", str(lake), "simulate", "--policy", str(candidate)]) == 2
        assert says in capsys.readouterr().err
    assert main(["--config", str(lake), "simulate", "--policy", str(tmp_path / "none.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--config", str(lake), "simulate", "--policy", str(candidate), "--since", "soon"]) == 2
    assert "'soon' is not a duration" in capsys.readouterr().err
    assert versions == {t: QueueTables.of(load_declaration(str(lake)), "q").open(t).version()
                        for t in ("attempts", "poison")}


def test_messages_the_poison_queue_quarantined_are_shown_quarantined_on_both_sides(lake: Path, spark,
                                                                                   tmp_path: Path):
    copy = tmp_path / "copy"
    shutil.copytree(lake.parent, copy)
    declaration = load_declaration(str(copy / lake.name))
    run_cycle(spark, declaration, "q", "poison")  # no poison handler: both poisoned messages to quarantine
    assert places(declaration)["bad"] == ["quarantine"]
    found = simulate(declaration, "q", declaration.queue("q").policy)
    assert found.simulated == found.recorded == {"processed": 5, "quarantined": 2, "waiting": 1}
    assert found.changed == 0
    # A candidate whose journey ends elsewhere is compared with the journey, not the quarantine.
    stricter = Policy.model_validate({"receive_retry_count": 0, "max_retry_cycles": 0,
                                      "receive_error_handling": "reject"})
    assert simulate(declaration, "q", stricter).changed == 5
