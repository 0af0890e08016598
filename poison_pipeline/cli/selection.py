"""The filters of the commands that select failed messages (`redrive`, `purge`): all must hold."""

from __future__ import annotations

import argparse
from pathlib import Path

from poison_pipeline.cli.common import UsageError
from poison_pipeline.cli.requests import add_field
from poison_pipeline.operations.selection import Filters


def add_selection_arguments(sub: argparse.ArgumentParser, model: type[Filters]) -> None:
    add_field(sub, model, "group", "--group", metavar="ID")
    add_field(sub, model, "error_type", "--error-type", metavar="TYPE")
    add_field(sub, model, "message_type", "--message-type", metavar="TYPE")
    add_field(sub, model, "conversation", "--conversation", metavar="ID")
    add_field(sub, model, "failed_after", "--failed-after", metavar="TIME")
    add_field(sub, model, "failed_before", "--failed-before", metavar="TIME")
    # The ids come from a file: `ids_of` reads it.
    sub.add_argument("--ids", metavar="FILE", dest="ids_file", help="a file of message ids, one a line")
    add_field(sub, model, "where", "--where", metavar="EXPR")
    add_field(sub, model, "as_of_version", "--as-of-version", metavar="VERSION", type=int)


def ids_of(args: argparse.Namespace) -> dict[str, list[str]]:
    """The `ids` field, from the file `--ids` names (nothing when it was not given)."""
    if args.ids_file is None:
        return {}
    try:
        text = Path(args.ids_file).read_bytes().decode("utf-8")
    except OSError as error:
        raise UsageError(f"--ids {args.ids_file}: {error.strerror}") from None
    except UnicodeDecodeError as error:  # no message id is anything but UTF-8 text
        raise UsageError(f"--ids {args.ids_file}: not UTF-8 text (byte {error.start})") from None
    return {"ids": [line.strip() for line in text.splitlines() if line.strip()]}
