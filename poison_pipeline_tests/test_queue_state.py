"""Enabled or disabled follows the order of commits, not the clocks that stamped the events
(SPEC section 6, step 1), and `enable` verifies what it recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from poison_pipeline import cli
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline.operations.cycle import run_cycle
from poison_pipeline.storage import control
from poison_pipeline.storage.control import queue_state, set_enabled
from poison_pipeline.storage.tables import QueueTables
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.support import places, queue, send


def faulting_queue(tmp_path: Path) -> Path:
    config = tmp_path / "poison_pipeline.yaml"
    config.write_text(yaml.safe_dump({
        "lake_root": str(tmp_path / "lake"), "spark": SPARK.model_dump(),
        "queues": queue(receive_retry_count=0, max_retry_cycles=0, receive_error_handling="fault"),
    }))
    return config


def test_enable_after_a_disable_stamped_in_the_future_enables_the_queue(spark, tmp_path, capsys):
    config = faulting_queue(tmp_path)
    declaration = load_declaration(config)
    tables = QueueTables.of(declaration, "q")
    send(declaration, {"bad": {"fail": True}})
    tomorrow = datetime.now(UTC) + timedelta(days=1)  # a cycle run with a future `now` (or a fast clock)
    run_cycle(spark, declaration, "q", "inbound", now=tomorrow)
    assert not queue_state(tables).enabled
    assert cli.main(["--config", str(config), "enable", "q", "--reason", "fixed"]) == cli.EXIT_OK
    assert "enabled by" in capsys.readouterr().out
    state = queue_state(tables)
    assert state.enabled and state.reason == "fixed"
    send(declaration, {"good": {}})
    assert run_cycle(spark, declaration, "q", "inbound").skipped is None
    assert places(declaration)["good"] == ["processed:processed"]


def test_a_later_commit_wins_whatever_its_clock_says(make_declaration, monkeypatch):
    tables = QueueTables.of(make_declaration(queue()), "q")
    set_enabled(tables, False, "ops", "maintenance")
    # A host whose clock is a year behind enables it: that commit is the newer one.
    behind = datetime.now(UTC) - timedelta(days=365)
    monkeypatch.setattr(control, "datetime", type("Clock", (), {"now": staticmethod(lambda tz=None: behind)}))
    assert set_enabled(tables, True, "ops", "maintenance over")
    state = queue_state(tables)
    assert state.enabled and state.since == behind and state.actor == "ops"
    assert not set_enabled(tables, True, "ops", "again")  # already enabled: nothing recorded


def test_enable_says_so_when_the_state_does_not_show_what_it_committed(tmp_path, monkeypatch, capsys):
    config = faulting_queue(tmp_path)
    tables = QueueTables.of(load_declaration(config), "q")
    set_enabled(tables, False, "ops", "maintenance")
    real = control.queue_state
    reads = iter([real(tables), control.QueueState(enabled=False)])  # before the commit, then after it
    monkeypatch.setattr(control, "queue_state", lambda t: next(reads))
    assert cli.main(["--config", str(config), "enable", "q"]) == cli.EXIT_INCOMPLETE
    assert "enable was committed but the queue still reads disabled" in capsys.readouterr().err
