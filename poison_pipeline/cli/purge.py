"""`purge QUEUE --table T --older-than AGE [filters] [--yes]`: delete failed messages for good."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

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
from poison_pipeline.cli.selection import add_selection_arguments, ids_of
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.purge import PurgeError, PurgeRequest, PurgeResult, purge, result_json
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.operations.selection import SelectionError
from poison_pipeline.text.purge import format_purge


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "purge", "delete failed messages for good (older than an age; confirmation or --yes)",
        "Delete for good the messages of QUEUE's poison, dead_letter or quarantine table that failed\n"
        "more than AGE ago (--older-than, by the time they entered the table) and match the filters\n"
        "(all must hold). Without --yes it shows what it would delete (counts per failure group and\n"
        "message type, sample ids) and asks on the terminal; when stdin is not a terminal it refuses\n"
        "(exit 1) and deletes nothing. Each purged message keeps a row in the queue's purged ledger\n"
        "(id, where it was, when it failed, which action), counted by the conservation line; the\n"
        "action is recorded in the actions ledger. A purge killed midway is completed by the next\n"
        "purge of the queue (or by running it again with its --id); nothing is deleted twice.",
        run,
    )
    add_field(sub, PurgeRequest, "queue", metavar="QUEUE")
    add_field(sub, PurgeRequest, "table", "--table", required=True, choices=FAILURE_TABLES)
    add_field(sub, PurgeRequest, "older_than", "--older-than", metavar="AGE", required=True)
    add_selection_arguments(sub, PurgeRequest)
    add_field(sub, PurgeRequest, "confirm", "--yes", "-y", action="store_true", help="delete without asking")
    add_field(sub, PurgeRequest, "id", "--id", metavar="ID")
    add_actor(sub)
    add_json(sub)


def run(args: argparse.Namespace) -> int:
    request = request_of(PurgeRequest, args, **ids_of(args))
    declaration = declaration_of(args)
    context = ActionContext(actor=args.actor, now=datetime.now(UTC))  # one cutoff for the preview and the purge
    try:
        if not request.confirm:
            preview = purge(declaration, request, context)
            if not preview.purged:
                return _nothing_to_purge(args, preview)
            _show(args, preview)
            if not _confirmed(args, preview.purged):
                return EXIT_INCOMPLETE
        result = purge(declaration, request.model_copy(update={"confirm": True}), context)
    except (PurgeError, SelectionError) as error:
        raise UsageError(str(error)) from None
    if not result.purged and not result.already_done:
        return _nothing_to_purge(args, result)
    _show(args, result)
    return EXIT_OK


def _confirmed(args: argparse.Namespace, count: int) -> bool:
    """Asked on the terminal; never without one (a pipe or a job cannot say yes by accident)."""
    if not sys.stdin.isatty():
        complain(args, f"refusing to delete {count} message(s) without --yes (stdin is not a terminal to "
                       "confirm on); nothing deleted")
        return False
    print(f"Delete {count} messages for good? [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        complain(args, "not confirmed; nothing deleted")
        return False
    return True


def _show(args: argparse.Namespace, result: PurgeResult) -> None:
    if args.json:
        print_json(result_json(result))
    else:
        print(format_purge(result))


def _nothing_to_purge(args: argparse.Namespace, result: PurgeResult) -> int:
    if args.json:
        print_json(result_json(result))
    complain(args, f"nothing to purge: no message in {args.queue}/{args.table} failed before "
                   f"{result.cutoff.isoformat()} and matches the filters")
    return EXIT_INCOMPLETE
