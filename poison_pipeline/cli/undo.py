"""`undo ACTION_ID`: reverse a redrive, an edit, a purge, an archive or a restore (itself recorded as an action)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from poison_pipeline.cli.common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    Commands,
    UsageError,
    add_actor,
    add_command,
    add_json,
    declaration_of,
    print_json,
)
from poison_pipeline.cli.requests import add_field, request_of
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.operations.undo import UndoError, UndoRequest, undo
from poison_pipeline.text.undo import format_undo


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "undo", "reverse a redrive, an edit, a purge, an archive or a restore (itself recorded as an action)",
        "Undo ACTION_ID. A redrive: move back the messages still where it put them (from the table as\n"
        "it was before, by Delta time travel) and name those that moved on since. An edit: undone\n"
        "through its redrive (the original body comes back). A purge: when no other commit touched its\n"
        "tables since, restore each to the version it had before (Delta RESTORE); otherwise bring the\n"
        "messages back from Delta time travel (until a vacuum deletes those files) and out of the\n"
        "purged ledger.",
        run,
    )
    add_field(sub, UndoRequest, "action_id", metavar="ACTION_ID")
    add_field(sub, UndoRequest, "queue", "--queue", "-q", metavar="QUEUE")
    add_actor(sub)
    add_json(sub)


def run(args: argparse.Namespace) -> int:
    request = request_of(UndoRequest, args)
    declaration = declaration_of(args)
    try:
        result = undo(declaration, request, ActionContext(actor=args.actor))
    except UndoError as error:
        raise UsageError(str(error)) from None
    if args.json:
        print_json(asdict(result))
    else:
        print(format_undo(result))
    return EXIT_INCOMPLETE if result.unrecoverable else EXIT_OK

