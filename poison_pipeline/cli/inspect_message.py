"""`inspect MESSAGE_ID [--json] [--stack] [--as-of VERSION|TIME]`: one message, where it is and its attempts."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime

from poison_pipeline.cli.common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    Commands,
    UsageError,
    add_command,
    add_json,
    check_queue,
    complain,
    declaration_of,
    moment,
    print_json,
)
from poison_pipeline.operations.inspect_message import InspectError, inspect_message
from poison_pipeline.text.inspection import format_inspection


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "inspect", "show one message: where it is, counts, body and every attempt",
        "Find MESSAGE_ID in every queue's waiting tables, dead-letter, quarantine and processed\n"
        "ledger; show where it is, its abort/total abort/move counts, due time, last error, its\n"
        "body rendered by encoding (json pretty-printed, xml and text as text, binary or\n"
        "undecodable bodies as hex; never evaluated) and its whole attempt history. Changes\n"
        "nothing. With --json the raw body is included base64-encoded as raw_body.",
        run,
    )
    sub.add_argument("message_id", metavar="MESSAGE_ID", help="the message's message_id")
    add_json(sub)
    sub.add_argument("--stack", action="store_true", help="also print the stack trace of every error")
    sub.add_argument("--as-of", metavar="VERSION|TIME", type=_as_of, default=None,
                     help="show the copy a table held then (Delta time travel): a version of --table, or "
                          "an ISO 8601 time (every table as it was then)")
    sub.add_argument("--table", metavar="TABLE", default=None,
                     help="only this table (inbound, retry_k, poison, dead_letter, quarantine, processed, "
                          "attempts); required with --as-of VERSION")
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue")


def _as_of(text: str) -> int | datetime:
    if text.isdigit():
        return int(text)
    try:
        return moment(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a table version (a number) nor an ISO 8601 "
                                         "time (e.g. 2026-11-22T10:00Z)") from None


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    if args.queue is not None:
        check_queue(declaration, args.queue)
    try:
        found = inspect_message(declaration, args.message_id, args.as_of, args.queue, args.table)
    except InspectError as error:
        raise UsageError(str(error)) from None
    if found is None:
        when = "" if args.as_of is None else f" as of {args.as_of}"
        complain(args, f"message {args.message_id!r} is in no table of queues {', '.join(declaration.queues)}{when}")
        return EXIT_INCOMPLETE
    if args.json:
        print_json(asdict(found))
    else:
        print(format_inspection(found, datetime.now(UTC), stacks=args.stack))
    return EXIT_OK
