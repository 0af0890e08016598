"""`edit MESSAGE_ID --body-file F [--header K=V]...`: fix a failed message's body and send it back."""

from __future__ import annotations

import argparse
import base64
from dataclasses import asdict
from pathlib import Path

from poison_pipeline.cli.common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    Commands,
    UsageError,
    add_actor,
    add_command,
    add_json,
    complain,
    declaration_of,
    print_json,
)
from poison_pipeline.cli.requests import add_field, request_of
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.edit import EditError, EditNotFound, EditRequest, edit
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.text.edit import format_edit


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "edit", "replace a failed message's body (and headers) and send it back to its inbound",
        "Replace the body of MESSAGE_ID, found in its queue's poison, dead_letter or quarantine\n"
        "table, with the bytes of --body-file (checked against the message's encoding and the\n"
        "queue's max_body_bytes; refused, with nothing changed, if invalid), set any --header, and\n"
        "redrive that one message to its queue's inbound. The edit is recorded in the actions\n"
        "ledger and, with the original and new body and headers, in the queue's edits table\n"
        "(shown by inspect and history). Killed and run again with the same arguments (or --id), it\n"
        "completes without writing anything twice; run again after it completed, it changes nothing.",
        run,
    )
    add_field(sub, EditRequest, "message_id", metavar="MESSAGE_ID")
    # The body comes from a file, as raw bytes: `run` reads it.
    sub.add_argument("--body-file", metavar="FILE", required=True, help="the new body, as raw bytes")
    sub.add_argument("--header", metavar="K=V", type=_header, action="append",
                     help="set a header (repeatable); the other headers are kept")
    add_field(sub, EditRequest, "queue", "--queue", "-q", metavar="QUEUE")
    add_field(sub, EditRequest, "source", "--from", choices=FAILURE_TABLES)
    add_field(sub, EditRequest, "id", "--id", metavar="ID")
    add_actor(sub)
    add_json(sub)


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--header {text!r}: write it as KEY=VALUE")
    return key, value


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    try:
        body = Path(args.body_file).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"--body-file {args.body_file}: no such file") from None
    except OSError as error:
        raise UsageError(f"--body-file {args.body_file}: {error.strerror}") from None
    request = request_of(EditRequest, args, body=base64.b64encode(body).decode("ascii"), encoding="base64",
                         headers=dict(args.header or []))
    try:
        result = edit(declaration, request, ActionContext(actor=args.actor))
    except EditError as error:
        raise UsageError(str(error)) from None
    except EditNotFound as error:
        complain(args, str(error))
        return EXIT_INCOMPLETE
    if args.json:
        print_json(asdict(result))
    else:
        print(format_edit(result))
    return EXIT_OK
