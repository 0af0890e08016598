"""A ramped, canary redrive: steps that grow, each once a cycle took the one before, stopping by
itself (and parking what failed again) when the messages it sends fail again."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from poison_pipeline import cli
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.actions import DONE, PLANNED, find_action, list_actions
from poison_pipeline.operations.archive import ArchiveRequest, archive
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.operations.redrive import RedriveRequest, redrive
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline.storage.writer import QueueWriter
from poison_pipeline_tests.support import places, table_versions
from poison_pipeline_tests.test_outage import HANDLER, Lake

POLICY = {"receive_retry_count": 0, "max_retry_cycles": 1, "retry_cycle_delay": "1h", "receive_error_handling": "move",
          "outage_threshold": 0}
LATER = timedelta(hours=2)


class Crash(Exception):  # noqa: N818 - a simulated kill of the process
    pass


@pytest.fixture
def poisoned(spark, tmp_path: Path) -> tuple[Path, Lake]:
    """Queue q: d0..d5 in poison, each failed while its dependency was down (the flag file)."""
    lake = Lake(tmp_path)
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({"lake_root": "lake", "queues": {"q": {"handler": HANDLER, "policy": POLICY}}}))
    declaration = load_declaration(str(config))
    from poison_pipeline.operations.records import enqueue
    assert not enqueue(declaration, "q", [lake.down(f"d{i}") for i in range(6)]).refused
    run_cycle(spark, declaration, "q", "inbound")
    run_cycle(spark, declaration, "q", "retry_1", now=datetime.now(UTC) + LATER)
    assert all(p == ["poison"] for p in places(declaration).values()) and len(places(declaration)) == 6
    return config, lake


def ramp_of(config: Path, ramp_id: str) -> Any:
    return find_action(QueueTables.of(load_declaration(str(config)), "q"), ramp_id)


def test_a_ramp_sends_its_steps_one_cycle_after_another_and_completes(spark, poisoned, capsys):
    config, lake = poisoned
    declaration = load_declaration(str(config))
    lake.flag.unlink()  # fixed: the messages now succeed
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", "--ramp", "1,3,all",
                     "--id", "r1", "--json"]) == 0
    started = json.loads(capsys.readouterr().out)
    assert (started["state"], started["step"], started["sent"], started["selected"]) == ("running", 1, 1, 6)
    assert sorted(m for m, p in places(declaration).items() if p == ["inbound"]) == ["d0"]
    # Each cycle takes a step; once it committed, the next step goes (2 more, then the last 3).
    for waiting in (["d1", "d2"], ["d3", "d4", "d5"]):
        run_cycle(spark, declaration, "q", "inbound")
        assert sorted(m for m, p in places(declaration).items() if p == ["inbound"]) == waiting
    run_cycle(spark, declaration, "q", "inbound")
    assert all(p == ["processed:processed"] for p in places(declaration).values())
    ramp = ramp_of(config, "r1")
    assert (ramp.state, ramp.counts["completed_steps"], ramp.counts["sent"]) == (DONE, 3, 6)
    assert [a.action_id for a in list_actions(declaration, "q") if a.kind == "redrive"] == \
        ["r1--step1", "r1--step2", "r1--step3"]


def test_a_ramp_stops_on_the_first_step_that_fails_again_and_parks_it(spark, poisoned, capsys):
    config, _ = poisoned  # the dependency stays down
    declaration = load_declaration(str(config))
    report = redrive(declaration, RedriveRequest(queue="q", source_tables=["poison"], ramp=["1", "3", "all"], id="r1"))
    assert report.ramp is not None and report.ramp.step == 1
    run_cycle(spark, declaration, "q", "inbound")  # d0 fails again and waits in retry_1; the ramp stops
    ramp = ramp_of(config, "r1")
    assert (ramp.state, ramp.counts["stopped_at_step"], ramp.counts["parked"]) == (DONE, 1, 1)
    # Asked again, the stopped ramp names the message that failed again, as its ledger counts it.
    again = redrive(declaration, RedriveRequest(queue="q", source_tables=["poison"], ramp=["1", "3", "all"],
                                                id="r1")).ramp
    assert again is not None and (again.state, again.failed_again) == ("stopped", ["d0"])
    assert ramp.counts["failed_again"] == 1
    # Parked: back in poison from retry_1; the rest never left.
    assert places(declaration) == {f"d{i}": ["poison"] for i in range(6)}
    [parked] = [r for r in QueueTables.of(declaration, "q").open("poison").to_pyarrow_table().to_pylist()
                if r["message_id"] == "d0"]
    assert parked["batch_id"] == "r1/parked"
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", "--ramp", "1,3,all",
                     "--id", "r1"]) == 0
    assert "stopped at step 1" in capsys.readouterr().out


def test_a_ramp_killed_while_parking_is_completed_by_the_next_cycle(spark, poisoned, monkeypatch):
    config, _ = poisoned
    declaration = load_declaration(str(config))
    redrive(declaration, RedriveRequest(queue="q", source_tables=["poison"], ramp=["2", "all"], id="r1"))
    original = QueueWriter.replace_batches

    def die(self: QueueWriter, table: str, *args: Any, **kwargs: Any) -> Any:
        if table == "retry_1":
            raise Crash("killed between the parked copy and the removal")
        return original(self, table, *args, **kwargs)

    monkeypatch.setattr(QueueWriter, "replace_batches", die)
    with pytest.raises(Crash):
        run_cycle(spark, declaration, "q", "inbound")
    monkeypatch.setattr(QueueWriter, "replace_batches", original)
    assert ramp_of(config, "r1").state == PLANNED
    run_cycle(spark, declaration, "q", "retry_1")  # any cycle of the queue completes it first
    ramp = ramp_of(config, "r1")
    assert (ramp.state, ramp.counts["stopped_at_step"], ramp.counts["parked"]) == (DONE, 1, 2)
    assert places(declaration) == {f"d{i}": ["poison"] for i in range(6)}


@pytest.mark.parametrize(("arguments", "says"), [
    (["--ramp", "1,1,all"], "each step must send more than the one before"),
    (["--ramp", "all,5"], "'all' is not a step"),
    (["--ramp", "0,10"], "'0' is not a step"),
    (["--ramp", "1,10", "--to", "q"], "not with to"),
    (["--ramp", "1,10", "--from", "dead_letter"], "one source table"),
    (["--ramp", "1,10", "--max-failures", "-1"], "--max-failures"),
])
def test_a_bad_ramp_is_refused_and_changes_nothing(poisoned, capsys, arguments, says):
    config, _ = poisoned
    before = table_versions(load_declaration(str(config)))
    assert cli.main(["--config", str(config), "redrive", "q", "--from", "poison", *arguments]) == 2
    assert says in capsys.readouterr().err
    assert table_versions(load_declaration(str(config))) == before


def test_a_step_whose_messages_left_their_table_is_skipped_and_the_ramp_completes(spark, poisoned):
    config, lake = poisoned
    declaration = load_declaration(str(config))
    lake.flag.unlink()
    redrive(declaration, RedriveRequest(queue="q", source_tables=["poison"], ramp=["1", "3", "all"], id="r1"))
    # Step 2's messages (d1, d2) are archived meanwhile: nothing of step 2 is left to send.
    archive(declaration, ArchiveRequest(queue="q", table="poison", ids=["d1", "d2"]))
    run_cycle(spark, declaration, "q", "inbound")  # takes d0; then step 3 goes
    assert sorted(m for m, p in places(declaration).items() if p == ["inbound"]) == ["d3", "d4", "d5"]
    run_cycle(spark, declaration, "q", "inbound")
    ramp = ramp_of(config, "r1")
    assert (ramp.state, ramp.counts["completed_steps"], ramp.counts["sent"]) == (DONE, 3, 4)
    assert places(declaration)["d1"] == places(declaration)["d2"] == ["poison"]


def test_a_dry_run_of_a_ramp_shows_its_steps_and_changes_nothing(poisoned, capsys):
    config, _ = poisoned
    before = table_versions(load_declaration(str(config)))
    command = ["--config", str(config), "redrive", "q", "--from", "poison", "--ramp", "1,4,10,all", "--dry-run"]
    assert cli.main([*command, "--json"]) == 0
    preview = json.loads(capsys.readouterr().out)
    assert (preview["moved"], preview["ramp_steps"]) == (6, [1, 3, 2])  # the 10 and `all` steps send nothing
    assert cli.main(command) == 0
    assert "a ramp would send them in 3 step(s) of 1, 3, 2" in capsys.readouterr().out
    assert table_versions(load_declaration(str(config))) == before
