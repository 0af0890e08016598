"""`actions [--queue Q] [--json]`: the operator actions recorded per queue (who, when, what, state)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from poison_pipeline.cli.common import (
    EXIT_OK,
    Commands,
    add_command,
    add_json,
    check_queue,
    declaration_of,
    print_json,
)
from poison_pipeline.operations.actions import list_actions
from poison_pipeline.text.actions import format_actions


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "actions", "list the operator actions recorded per queue (who, when, what, state)",
        "List every operator action recorded in the queues' actions ledgers, oldest first: its id,\n"
        "kind (enable, end_conversation, ...), actor, time, state (planned, done, undone, abandoned),\n"
        "counts and arguments. An action left `planned` was interrupted: run it again with its id (the\n"
        "queue's next cycle completes it, or closes it `abandoned` if it was killed before its plan).",
        run,
    )
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue")
    add_json(sub, "a table")


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    if args.queue is not None:
        check_queue(declaration, args.queue)
    found = list_actions(declaration, args.queue)
    if args.json:
        print_json([asdict(a) for a in found])
    else:
        print(format_actions(found))
    return EXIT_OK
