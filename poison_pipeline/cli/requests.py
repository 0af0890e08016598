"""Command-line options that fill an operator action's request model: the model declares each
field's type, default, help and validation; a command only spells its options. A value the model
refuses is a usage error that names the option (exit 2), before anything is read or written."""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from poison_pipeline.cli.common import UsageError

Model = TypeVar("Model", bound=BaseModel)

# The options a parser fills its request from: field name -> how the user spells it.
_OPTIONS = "request_options"


def add_field(sub: argparse.ArgumentParser, model: type[BaseModel], name: str, *flags: str,
              **argparse_kwargs: Any) -> None:
    """An option (or, without flags, a positional argument) for `model`'s field `name`, its help the
    field's description. Left out, the field keeps the model's default."""
    description = model.model_fields[name].description
    if description and "help" not in argparse_kwargs:
        argparse_kwargs["help"] = _sentence_part(description).removesuffix(".")
    if flags:
        sub.add_argument(*flags, dest=name, default=argparse.SUPPRESS, **argparse_kwargs)
    else:
        sub.add_argument(name, **argparse_kwargs)
    options: dict[str, str] = dict(sub.get_default(_OPTIONS) or {})
    options[name] = flags[0] if flags else argparse_kwargs.get("metavar", name)
    sub.set_defaults(**{_OPTIONS: options})


def request_of(model: type[Model], args: argparse.Namespace, **values: Any) -> Model:
    """`model` filled from the options given (and `values`, what the command worked out itself)."""
    options: dict[str, str] = getattr(args, _OPTIONS, {})
    given = {name: getattr(args, name) for name in options if hasattr(args, name)}
    try:
        return model.model_validate(given | values)
    except ValidationError as error:
        raise UsageError(_said(error.errors()[0], options)) from None


def _said(error: ErrorDetails, options: dict[str, str]) -> str:
    name = str(error["loc"][0]) if error["loc"] else ""
    option = options.get(name, name)
    if error["type"] == "value_error":  # ours: the message starts with the value (or, of the whole request, says it)
        return " ".join(filter(None, (option, error["msg"].removeprefix("Value error, "))))
    return f"{option} {error['input']!r}: {_sentence_part(error['msg'])}"


def _sentence_part(text: str) -> str:
    """`text` to follow a colon: its first word lowercased, unless it is an acronym (ISO)."""
    return text[0].lower() + text[1:] if text[1:2].islower() else text
