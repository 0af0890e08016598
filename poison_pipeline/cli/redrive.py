"""`redrive QUEUE --from TABLE [filters] [--dry-run] [--rate N/s]`: failed messages back to an inbound."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict

from rich.console import Console
from rich.progress import Progress

from poison_pipeline.cli.common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    Commands,
    UsageError,
    action_id,
    add_actor,
    add_command,
    add_json,
    complain,
    declaration_of,
    print_json,
)
from poison_pipeline.cli.selection import add_selection_arguments, selection
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.redrive import RedriveError, format_redrive, redrive
from poison_pipeline.operations.selection import SelectionError


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "redrive", "send failed messages back to an inbound queue (filters, dry run, rate, resumable)",
        "Send the messages selected in QUEUE's poison, dead_letter or quarantine table back to its\n"
        "inbound (or --to another queue's). Filters combine (all must hold). Messages keep their\n"
        "message_id; their abort and move counts restart and redrive_count goes up by one.\n"
        "Messages the target already processed, and messages redriven max_redrives times (unless\n"
        "--force), are left where they are and counted. A redrive has an id (--id, default a new\n"
        "one at every invocation): killed and run again with the same id it completes as it was\n"
        "recorded, without moving anything twice; run again after it completed, it moves nothing.",
        run,
    )
    sub.add_argument("queue", metavar="QUEUE", help="the queue whose failed messages are redriven")
    sub.add_argument("--from", dest="source", required=True, choices=FAILURE_TABLES, help="where they are")
    sub.add_argument("--to", metavar="QUEUE", default=None, help="another declared queue's inbound")
    add_selection_arguments(sub)
    sub.add_argument("--dry-run", action="store_true", help="say what would move; change nothing")
    sub.add_argument("--rate", metavar="N/s", type=_rate, help="release N messages a second (due times)")
    sub.add_argument("--limit", metavar="N", type=int, help="move at most N messages")
    sub.add_argument("--id", metavar="ID", type=action_id, help="the redrive's id (resume or repeat it)")
    sub.add_argument("--force", action="store_true", help="also messages past the loop guard (max_redrives)")
    add_actor(sub)
    add_json(sub)


def _rate(text: str) -> float:
    try:
        return float(text.removesuffix("/s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate: write messages per second, e.g. 50/s") from None


@contextlib.contextmanager
def _progress_bar(what: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr when it is a terminal; nothing otherwise (pipes, logs, tests)."""
    if not sys.stderr.isatty():
        yield None
        return
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    try:
        with _progress_bar("redriving") as progress:
            result = redrive(declaration, args.queue, args.source, selection(args), to=args.to,
                             dry_run=args.dry_run, rate=args.rate, limit=args.limit, redrive_id=args.id,
                             force=args.force, actor=args.actor, progress=progress)
    except (RedriveError, SelectionError) as error:
        raise UsageError(str(error)) from None
    if args.json:
        print_json(asdict(result))
    else:
        print(format_redrive(result))
    if not result.moved and not result.already_done:
        complain(args, f"nothing to move: {result.selected} message(s) selected in {args.queue}/{args.source}")
        return EXIT_INCOMPLETE
    return EXIT_OK
