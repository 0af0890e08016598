"""Each operator action's inputs are declared once, as its request model: the command line's
options fill it and Dagster's run config inherits it, so the three surfaces take the same fields
and refuse a bad value with the same words, before anything is read or written."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from poison_pipeline import cli
from poison_pipeline.defs.operator_jobs import EditConfig, EnableConfig, EndConversationConfig, PurgeConfig, UndoConfig
from poison_pipeline.defs.redrive import RedriveConfig
from poison_pipeline.operations.edit import EditRequest
from poison_pipeline.operations.enable import EnableRequest
from poison_pipeline.operations.end_conversation import EndConversationRequest
from poison_pipeline.operations.purge import PurgeRequest
from poison_pipeline.operations.redrive import RedriveRequest
from poison_pipeline.operations.undo import UndoRequest

ACTIONS: list[tuple[str, type[BaseModel], type[BaseModel]]] = [
    ("redrive", RedriveRequest, RedriveConfig),
    ("purge", PurgeRequest, PurgeConfig),
    ("edit", EditRequest, EditConfig),
    ("undo", UndoRequest, UndoConfig),
    ("enable", EnableRequest, EnableConfig),
    ("end-conversation", EndConversationRequest, EndConversationConfig),
]


def _command(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


@pytest.mark.parametrize(("command", "request_model", "config"), ACTIONS, ids=[a[0] for a in ACTIONS])
def test_dagster_takes_the_request_of_the_command_line_without_the_queue_and_with_an_actor(
        command: str, request_model: type[BaseModel], config: type[BaseModel]) -> None:
    assert set(config.model_fields) == set(request_model.model_fields) - {"queue"} | {"actor"}
    for name, field in config.model_fields.items():
        if name != "actor":
            assert field.description == request_model.model_fields[name].description, name
            assert field.default == request_model.model_fields[name].default, name


@pytest.mark.parametrize(("command", "request_model", "config"), ACTIONS, ids=[a[0] for a in ACTIONS])
def test_every_option_of_an_action_fills_a_field_of_its_request(
        command: str, request_model: type[BaseModel], config: type[BaseModel]) -> None:
    options = _command(command).get_default("request_options")
    assert options and set(options) <= set(request_model.model_fields)
    # What the command line does not take from an option, it works out itself (a file's bytes, K=V
    # headers): no field of the request is out of its reach.
    worked_out = {"redrive": {"ids"}, "purge": {"ids"}, "edit": {"body", "encoding", "headers"}}
    assert set(request_model.model_fields) == set(options) | worked_out.get(command, set())


@pytest.mark.parametrize(("command", "model", "config", "values", "says"), [
    (["redrive", "q", "--from", "poison", "--rate", "-2"], RedriveRequest, RedriveConfig,
     {"rate": -2}, "-2.0: give a positive number of messages per second"),
    (["redrive", "q", "--from", "poison", "--limit", "0"], RedriveRequest, RedriveConfig,
     {"limit": 0}, "0: give a positive number of messages"),
    (["redrive", "q", "--from", "poison", "--failed-after", "yesterday"], RedriveRequest, RedriveConfig,
     {"failed_after": "yesterday"}, "'yesterday' is not an ISO 8601 time"),
    (["redrive", "q", "--from", "poison", "--id", "../up"], RedriveRequest, RedriveConfig,
     {"id": "../up"}, "'../up' cannot name a folder of the lake"),
    (["purge", "q", "--table", "poison", "--older-than", "soon"], PurgeRequest, PurgeConfig,
     {"table": "poison", "older_than": "soon"}, "'soon' is not a duration"),
    (["purge", "q", "--table", "poison", "--older-than", "1d", "--group", " "], PurgeRequest, PurgeConfig,
     {"table": "poison", "older_than": "1d", "group": " "}, "' ': leave it out or give a value"),
    (["enable", "q", "--reason", ""], EnableRequest, EnableConfig, {"reason": ""},
     "'': leave it out or give a value"),
    (["end-conversation", "c-1", "--code", "x", "--description", "d"], EndConversationRequest,
     EndConversationConfig, {"conversation_id": "c-1", "code": "x", "description": "d"},
     "valid integer"),
])
def test_a_bad_value_is_refused_with_the_same_words_by_the_command_line_python_and_dagster(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str], model: type[BaseModel],
        config: type[BaseModel], values: dict[str, object], says: str) -> None:
    # No declaration at all: the request is refused before the declaration is even read.
    missing = str(tmp_path / "nowhere.yaml")
    assert cli.main(["--config", missing, *command]) == cli.EXIT_USAGE
    told = capsys.readouterr().err
    assert says in told and "nowhere.yaml" not in told
    queue = {"queue": "q"} if "queue" in model.model_fields and model is not EndConversationRequest else {}
    for surface, given in ((model, values | queue), (config, values)):
        with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(".", r"\.")):
            surface.model_validate(given)


def test_a_request_names_a_field_it_does_not_declare() -> None:
    with pytest.raises(ValidationError, match="sourc\n  Extra inputs are not permitted"):
        RedriveRequest.model_validate({"queue": "q", "sourc": ["poison"]})


def test_a_dagster_redrive_window_narrows_the_failure_times_it_was_given() -> None:
    from datetime import UTC, datetime

    request = RedriveRequest(queue="q", failed_after="2026-11-20T06:00:00Z")
    day = request.within(datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 21, tzinfo=UTC)).selection()
    assert (day.failed_after, day.failed_before) == (datetime(2026, 11, 20, 6, tzinfo=UTC),
                                                     datetime(2026, 11, 21, tzinfo=UTC))
