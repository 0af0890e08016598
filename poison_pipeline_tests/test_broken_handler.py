"""A queue whose handler cannot be imported is contained: the code location loads, the other queues'
sensors request their cycles and those cycles run, the broken queue's sensors skip with the import
error and its inbound reports a failing user_code check once; `check` names the file and line, and
`status` and `enqueue` say it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from dagster import AssetCheckEvaluation, AssetKey, DagsterInstance, RunRequest, SensorResult, build_sensor_context

from poison_pipeline import enqueue
from poison_pipeline.cli import main
from poison_pipeline.defs.alerts import USER_CODE_BROKEN
from poison_pipeline.defs.build import build_definitions
from poison_pipeline.defs.checks import USER_CODE
from poison_pipeline.defs.naming import alert_job_name, alert_sensor_name, job_name, sensor_name
from poison_pipeline.domain.declaration import load_declaration
from poison_pipeline_tests.conftest import SPARK
from poison_pipeline_tests.support import HANDLER, places

QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
POLICY = {"receive_retry_count": 1, "max_retry_cycles": 1, "retry_cycle_delay": 0}


def _write(tmp_path: Path, broken: str = "nope.missing:handle") -> Path:
    path = tmp_path / "poison_pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "lake_root": str(tmp_path / "lake"), "spark": SPARK.model_dump(mode="json"),
        "queues": {"orders": {"handler": HANDLER, "policy": POLICY},
                   # a queue named as the product names things, beside the broken one
                   "inbound": {"handler": HANDLER, "policy": POLICY},
                   "refunds": {"handler": broken, "policy": POLICY}}}, sort_keys=False))
    return path


def _sensor(defs, queue: str, table: str, instance: DagsterInstance, cursor: str | None = None) -> SensorResult:
    sensor = defs.get_sensor_def(sensor_name(queue, table))
    result = sensor(build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
    assert isinstance(result, SensorResult)
    return result


def test_the_code_location_loads_with_a_broken_handler_and_only_that_queue_stops(spark, tmp_path):
    path = _write(tmp_path)
    # What `dagster dev` loads: before, the import error failed the whole code location.
    code = "import poison_pipeline.definitions as d; print(len(d.defs.resolve_all_job_defs()))"
    loaded = subprocess.run([sys.executable, "-c", code], env={"POISON_PIPELINE_CONFIG": str(path), "PATH": "/usr/bin"},
                            capture_output=True, text=True, check=False)
    assert loaded.returncode == 0, loaded.stderr[-2000:]

    declaration = load_declaration(path, import_code=False)
    for queue in ("orders", "refunds", "inbound"):
        enqueue(declaration, queue, [{"message_id": "1001", "message_type": "test", "body": {}}])
    defs = build_definitions(declaration)
    with DagsterInstance.ephemeral() as instance:
        healthy = [_sensor(defs, queue, "inbound", instance) for queue in ("orders", "inbound")]
        assert all(len(result.run_requests) == 1 for result in healthy)
        assert not any(result.asset_events for result in healthy)
        for queue in ("orders", "inbound"):
            ran = defs.resolve_job_def(job_name(queue, "inbound")).execute_in_process(instance=instance,
                                                                                    run_config=QUIET)
            assert ran.success
            checks = {e.check_name: e.passed for e in ran.get_asset_check_evaluations()}
            assert checks[USER_CODE] is True
        assert places(declaration, "orders") == {"1001": ["processed:processed"]}
        assert places(declaration, "inbound") == {"1001": ["processed:processed"]}

        first = _sensor(defs, "refunds", "inbound", instance)
        assert not first.run_requests
        assert "No module named 'nope'" in first.skip_reason.skip_message
        [evaluation] = first.asset_events
        assert isinstance(evaluation, AssetCheckEvaluation)
        assert evaluation.asset_key == AssetKey(["refunds", "inbound"]) and evaluation.check_name == USER_CODE
        assert not evaluation.passed and "queues.refunds.handler" in evaluation.description
        # Reported once: the next evaluation skips again and reports nothing new.
        again = _sensor(defs, "refunds", "inbound", instance, first.cursor)
        assert not again.run_requests and not again.asset_events
        retry = _sensor(defs, "refunds", "retry_1", instance)
        assert "No module named 'nope'" in retry.skip_reason.skip_message and not retry.asset_events
        assert places(declaration, "refunds") == {"1001": ["inbound"]}

        # Fixed and reloaded: the check passes once, and the queue's cycle is requested.
        fixed = build_definitions(load_declaration(_write(tmp_path, HANDLER), import_code=False))
        healed = _sensor(fixed, "refunds", "inbound", instance, again.cursor)
        [passed] = healed.asset_events
        assert passed.passed and len(healed.run_requests) == 1
        assert not _sensor(fixed, "refunds", "inbound", instance, healed.cursor).asset_events


def test_a_module_that_raises_at_import_is_contained_too(tmp_path, monkeypatch):
    package = tmp_path / "app_code"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "syntax.py").write_text("def handle(:\n")
    (package / "raising.py").write_text("raise RuntimeError('the database is not configured')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module, said in (("syntax", "SyntaxError"), ("raising", "RuntimeError: the database is not configured")):
        path = _write(tmp_path, f"app_code.{module}:handle")
        defs = build_definitions(load_declaration(path, import_code=False))
        with DagsterInstance.ephemeral() as instance:
            result = _sensor(defs, "refunds", "inbound", instance)
        assert said in result.skip_reason.skip_message
        assert not _sensor(defs, "orders", "inbound", DagsterInstance.ephemeral()).asset_events


def test_check_names_the_file_and_line_of_each_problem(tmp_path, capsys):
    path = _write(tmp_path)
    assert main(["--config", str(path), "check"]) == 2
    err = capsys.readouterr().err
    line = path.read_text().splitlines().index("    handler: nope.missing:handle") + 1
    assert f"{path}:{line}: queues.refunds.handler: 'nope.missing:handle' cannot be imported" in err
    assert "1 problem(s)" in err

    path.write_text(path.read_text().replace("receive_retry_count: 1", "receive_retry_count: -1", 1))
    assert main(["--config", str(path), "check"]) == 2
    err = capsys.readouterr().err
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "receive_retry_count: -1" in text)
    assert f"{path}:{line}: queues.orders.policy.receive_retry_count = -1" in err

    _write(tmp_path, HANDLER)
    assert main(["--config", str(path), "check"]) == 0
    assert "valid; 3 queue(s)" in capsys.readouterr().out


def test_status_and_enqueue_say_that_a_queue_s_code_does_not_import(tmp_path, capsys):
    path = _write(tmp_path)
    messages = tmp_path / "m.jsonl"
    messages.write_text(json.dumps({"message_id": "1001", "message_type": "test", "body": {}}) + "\n")
    assert main(["--config", str(path), "enqueue", str(messages), "--queue", "refunds"]) == 0
    said = capsys.readouterr()
    assert "enqueued 1 of 1" in said.out
    assert "warning: queue 'refunds': its code does not import here" in said.err and "nope" in said.err
    assert main(["--config", str(path), "enqueue", str(messages), "--queue", "orders"]) == 0
    assert "warning" not in capsys.readouterr().err

    assert main(["--config", str(path), "status"]) == 0
    out = capsys.readouterr().out
    assert "queue 'refunds': its code does not import here" in out and "queue 'orders'" not in out
    assert main(["--config", str(path), "status", "--json"]) == 0
    problems = json.loads(capsys.readouterr().out)["code_problems"]
    assert list(problems) == ["refunds"] and "nope" in problems["refunds"][0]


def test_a_queue_whose_code_does_not_import_raises_one_failed_alert_run(tmp_path):
    declaration = load_declaration(_write(tmp_path), import_code=False)
    defs = build_definitions(declaration)
    names = {s.name for s in defs.get_repository_def().sensor_defs}
    assert alert_sensor_name("refunds", USER_CODE_BROKEN) in names
    assert alert_sensor_name("orders", USER_CODE_BROKEN) not in names  # a queue whose code imports has none
    sensor = defs.get_sensor_def(alert_sensor_name("refunds", USER_CODE_BROKEN))
    with DagsterInstance.ephemeral() as instance:
        request = sensor(build_sensor_context(instance=instance, definitions=defs))
        assert isinstance(request, RunRequest)
        # The same problem has the same run key: Dagster launches it once, whatever the reloads.
        again = defs.get_sensor_def(alert_sensor_name("refunds", USER_CODE_BROKEN))(
            build_sensor_context(instance=instance, definitions=build_definitions(declaration)))
        assert isinstance(again, RunRequest) and again.run_key == request.run_key
        alert = defs.resolve_job_def(alert_job_name("refunds", USER_CODE_BROKEN))
        ran = alert.execute_in_process(instance=instance, run_config={**QUIET, **(request.run_config or {})},
                                       raise_on_error=False)
    assert not ran.success  # failing is the alert: the run shows red
    [failure] = [e for e in ran.all_events if e.is_step_failure]
    text = failure.step_failure_data.error.to_string() if failure.step_failure_data.error else ""
    described = failure.step_failure_data.user_failure_data
    assert "refunds's code does not import" in (text + (described.description if described else ""))
    assert "No module named 'nope'" in (text + (described.description if described else ""))


def test_every_command_names_the_file_and_line_of_a_declaration_error(tmp_path, capsys):
    path = tmp_path / "poison_pipeline.yaml"
    path.write_text("lake_root: lake\nqueues:\n  orders:\n    handler: poison_pipeline_tests.handlers:accept\n"
                    "    policy:\n      receive_retry_count: -1\n")
    for command in (["status"], ["groups"], ["actions"]):
        assert main(["--config", str(path), *command]) == 2
        assert f"{path}:6: queues.orders.policy.receive_retry_count = -1:" in capsys.readouterr().err
