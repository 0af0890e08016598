"""`undo ACTION_ID`: reverse a redrive, an edit or a purge (itself recorded as an action)."""

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
from poison_pipeline.operations.undo import UndoError, UndoResult, undo

NAMED = 10  # unrecoverable ids named on the line; --json lists them all


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "undo", "reverse a redrive, an edit or a purge (itself recorded as an action)",
        "Undo ACTION_ID: when no other commit touched its tables since, restore each to the version it\n"
        "had before (Delta RESTORE); otherwise move back the messages still where it put them (from\n"
        "the table as it was before, by Delta time travel) and name those that moved on since. A purge\n"
        "comes back from Delta time travel (until a vacuum deletes those files) and leaves the purged\n"
        "ledger; an edit is undone through its redrive (the original body comes back).",
        run,
    )
    sub.add_argument("action_id", metavar="ACTION_ID", help="an action id from `actions`")
    add_actor(sub)
    add_json(sub)


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    try:
        result = undo(declaration, args.action_id, actor=args.actor)
    except UndoError as error:
        raise UsageError(str(error)) from None
    if args.json:
        print_json(asdict(result))
    else:
        print(_text(args.action_id, result))
    return EXIT_INCOMPLETE if result.unrecoverable else EXIT_OK


def _text(action_id: str, result: UndoResult) -> str:
    if result.already_undone:
        return f"action {action_id} was undone already: nothing changed"
    lines = [f"undid {result.kind} {action_id} by {result.how} ({result.undo_id}): "
             f"{result.restored} message(s) back where they were"]
    if result.unrecoverable:
        named = ", ".join(result.unrecoverable[:NAMED]) + (" ..." if len(result.unrecoverable) > NAMED else "")
        lines.append(f"  {len(result.unrecoverable)} could not be brought back (they moved on since: processed or "
                     f"failed again): {named}")
    return "\n".join(lines)
