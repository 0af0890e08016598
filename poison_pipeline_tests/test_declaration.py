"""Invalid declarations fail at load, naming the field, the value and the rule."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import yaml

from poison_pipeline.domain.declaration import DeclarationError, load_declaration, parse_declaration

HANDLER = "poison_pipeline_tests.handlers:scripted"


def declare(**queue):
    return parse_declaration({"lake_root": "/tmp/lake", "queues": {"q": {"handler": HANDLER, **queue}}})


def test_defaults_are_the_wcf_defaults():
    policy = declare().queues["q"].policy
    assert (policy.receive_retry_count, policy.max_retry_cycles) == (5, 2)
    assert policy.retry_cycle_delay == timedelta(minutes=30)
    assert policy.receive_error_handling == "fault" and policy.max_attempts == 18


@pytest.mark.parametrize(
    ("queue", "field", "value", "rule"),
    [
        ({"poison_queue": {"receive_error_handling": "move"}},
         "q.poison_queue.receive_error_handling", "'move'", "drop, reject or fault"),
        ({"policy": {"receive_error_handling": "explode"}},
         "q.policy.receive_error_handling", "'explode'", "'fault', 'drop', 'reject' or 'move'"),
        ({"policy": {"receive_retry_count": -1}}, "q.policy.receive_retry_count", "-1", "greater than or equal to 0"),
        ({"policy": {"retry_cycle_delay": "soon"}}, "q.policy.retry_cycle_delay", "'soon'", "not a duration"),
        ({"policy": {"handler_timeout": "0s"}}, "q.policy.handler_timeout", "'0s'", "greater than zero"),
        ({"policy": {"unrecoverable": {"exceptions": ["nowhere.mod:Err"]}}},
         "q.policy.unrecoverable.exceptions", "['nowhere.mod:Err']", "cannot be imported"),
        ({"handler": "not a path"}, "q.handler", "'not a path'", "not an import path"),
        ({"handler": "poison_pipeline_tests.handlers:missing"}, "q.handler", "missing'", "cannot be imported"),
        ({"policy": {"retries": 3}}, "q.policy.retries", "3", "Extra inputs are not permitted"),
    ],
)
def test_invalid_values_name_field_value_and_rule(queue, field, value, rule):
    with pytest.raises(DeclarationError) as error:
        declare(**queue)
    message = str(error.value)
    assert f"queues.{field} = " in message and value in message and rule in message


def test_bad_queue_name_and_spark_connect_url():
    with pytest.raises(DeclarationError, match="queue name 'Bad-Name'"):
        parse_declaration({"lake_root": "/x", "queues": {"Bad-Name": {"handler": HANDLER}}})
    with pytest.raises(DeclarationError, match="spark.remote = 'http://x'.*sc://"):
        parse_declaration({"lake_root": "/x", "spark": {"remote": "http://x"},
                           "queues": {"q": {"handler": HANDLER}}})


def test_yaml_file_relative_lake_root_and_errors(tmp_path):
    path = tmp_path / "decl.yaml"
    path.write_text(f"lake_root: lake\nqueues:\n  q:\n    handler: {HANDLER}\n")
    assert load_declaration(path).lake_root == str(tmp_path / "lake")
    path.write_text("queues: [unclosed")
    with pytest.raises(DeclarationError, match="not valid YAML"):
        load_declaration(path)
    with pytest.raises(DeclarationError, match="does not exist"):
        load_declaration(tmp_path / "missing.yaml")


def test_the_example_declaration_loads():
    declaration = load_declaration("poison_pipeline.yaml")
    assert set(declaration.queues) == {"inventory", "orders", "accounts", "presentations", "checkout", "shipping"}


def test_small_cycles_default_to_a_thousand_messages_and_refuse_a_negative_threshold():
    queues = {"q": {"handler": HANDLER}}
    assert parse_declaration({"lake_root": "/tmp/lake", "queues": queues}).small_cycles.max_messages == 1000
    with pytest.raises(DeclarationError, match=r"small_cycles.max_messages = -1: must be a number of messages"):
        parse_declaration({"lake_root": "/tmp/lake", "queues": queues, "small_cycles": {"max_messages": -1}})


def test_credentials_in_spark_settings_are_hidden_where_a_declaration_is_shown():
    secret, other = "s3cr3t-value-9f2", "s3cr3t-other-4c1"
    spark = {"config": {"spark.hadoop.fs.s3a.secret.key": secret, "spark.hadoop.fs.s3a.access.key": other,
                        "spark.sql.shuffle.partitions": "4"}}
    declaration = parse_declaration({"lake_root": "/x", "spark": spark, "queues": {"q": {"handler": HANDLER}}})
    shown = repr(declaration) + str(declaration) + repr(declaration.spark)
    assert secret not in shown and other not in shown
    # The keys and the settings that are not credentials stay readable: they are what one debugs.
    assert "spark.hadoop.fs.s3a.secret.key" in shown and "'spark.sql.shuffle.partitions': '4'" in shown
    assert declaration.spark.config["spark.hadoop.fs.s3a.secret.key"] == secret  # the session still gets it
    # An error about the declaration shows it without them either.
    with pytest.raises(DeclarationError) as error:
        parse_declaration({"lake_root": "/x", "spark": {**spark, "remote": "http://x"},
                           "queues": {"q": {"handler": HANDLER}}})
    with pytest.raises(DeclarationError) as whole:
        parse_declaration({"spark": spark, "queues": {"q": {"handler": HANDLER}}})
    assert "lake_root" in str(whole.value)
    for message in (str(error.value), str(whole.value)):
        assert secret not in message and other not in message, message


def test_operator_commands_load_a_declaration_whose_handler_cannot_be_imported(tmp_path):
    """Importing the application's code is a step of its own: `status` works on a machine without
    the handlers' modules (or with one that fails to import), and loading for running queues still
    refuses the path with the field, the value and the rule."""
    config = tmp_path / "decl.yaml"
    config.write_text(yaml.safe_dump({"lake_root": str(tmp_path / "lake"), "alert_hook": "nowhere.alerts:page",
                                      "queues": {"q": {"handler": "nowhere.handlers:handle", "policy": {
                                          "unrecoverable": {"exceptions": ["nowhere.errors:Bad"]}}}}}))
    declaration = load_declaration(config, import_code=False)
    assert declaration.queues["q"].handler == "nowhere.handlers:handle"
    with pytest.raises(DeclarationError, match=r"q\.handler.*cannot be imported"):
        load_declaration(config)
    with pytest.raises(DeclarationError, match="not an import path"):
        parse_declaration({"lake_root": str(tmp_path), "queues": {"q": {"handler": "no path"}}}, import_code=False)
    status = subprocess.run([sys.executable, "-m", "poison_pipeline.cli", "--config", str(config), "status"],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
