"""`history MESSAGE_ID [--json]`: one timeline of everything that happened to a message."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from poison_pipeline.cli.common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    Commands,
    add_command,
    add_json,
    complain,
    declaration_of,
    print_json,
)
from poison_pipeline.operations.history import history
from poison_pipeline.text.history import format_history


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "history", "one timeline of everything that happened to a message",
        "Show the journey of MESSAGE_ID across every queue, oldest first: enqueued, each attempt\n"
        "(with its error and run id), each move between tables, dead-lettering, quarantine,\n"
        "redrives and edits (with their action ids), processing and purge. Reads the tables only;\n"
        "changes nothing.",
        run,
    )
    sub.add_argument("message_id", metavar="MESSAGE_ID", help="the message's message_id")
    add_json(sub, "a table")


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    journey = history(declaration, args.message_id)
    if not journey.events:
        complain(args, f"message {args.message_id!r} is in no table of queues {', '.join(declaration.queues)}")
        return EXIT_INCOMPLETE
    if args.json:
        print_json(asdict(journey))
    else:
        print(format_history(journey))
    return EXIT_OK
