"""`redrive QUEUE --from TABLE... [filters] [--dry-run] [--rate N/s]`: failed messages back to an inbound."""

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
from poison_pipeline.operations.redrive import RedriveError, RedriveRequest, redrive
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.operations.selection import SelectionError
from poison_pipeline.text.redrive import format_ramp, format_redrive


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
    add_field(sub, RedriveRequest, "queue", metavar="QUEUE")
    add_field(sub, RedriveRequest, "source_tables", "--from", metavar="TABLE", action="append", required=True,
              choices=FAILURE_TABLES, help="where they are: poison, dead_letter or quarantine (repeat it for "
              "several; a rate is shared by them, a limit counts them all)")
    add_field(sub, RedriveRequest, "to", "--to", metavar="QUEUE")
    add_selection_arguments(sub, RedriveRequest)
    add_field(sub, RedriveRequest, "dry_run", "--dry-run", action="store_true")
    add_field(sub, RedriveRequest, "rate", "--rate", metavar="N/s")
    add_field(sub, RedriveRequest, "limit", "--limit", metavar="N")
    add_field(sub, RedriveRequest, "id", "--id", metavar="ID")
    add_field(sub, RedriveRequest, "force", "--force", action="store_true")
    add_field(sub, RedriveRequest, "ramp", "--ramp", metavar="STEPS")
    add_field(sub, RedriveRequest, "max_failures", "--max-failures", metavar="N", type=int)
    add_actor(sub)
    add_json(sub)


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
    request = request_of(RedriveRequest, args, **ids_of(args))
    declaration = declaration_of(args)
    try:
        with _progress_bar("redriving") as progress:
            report = redrive(declaration, request, ActionContext(actor=args.actor, progress=progress))
    except (RedriveError, SelectionError) as error:
        raise UsageError(str(error)) from None
    if report.ramp is not None:
        if args.json:
            print_json(asdict(report.ramp))
        else:
            print(format_ramp(report.ramp))
        if report.ramp.ramp_id is None:
            complain(args, f"nothing to move: no message selected in {args.queue}/{request.source_tables[0]}")
            return EXIT_INCOMPLETE
        return EXIT_OK
    if args.json:
        # A dry run recorded no action: an id would name nothing `undo` or `actions` knows.
        unrecorded = {"redrive_id": None, "action_id": None}
        results = [asdict(result) | (unrecorded if result.dry_run else {}) for result in report.results]
        print_json(results[0] if len(request.source_tables) == 1 else results)
    else:
        print("\n".join(format_redrive(result) for result in report.results))
    if not report.moved and not report.already_done:
        complain(args, f"nothing to move: {report.selected} message(s) selected in {args.queue}/"
                       f"{', '.join(request.source_tables)}")
        return EXIT_INCOMPLETE
    return EXIT_OK
