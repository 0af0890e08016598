"""`groups [--queue Q] [--table T] [--json]`: failures of poison, dead_letter and quarantine by signature."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from datetime import UTC, datetime

from rich.console import Console

from poison_pipeline.cli.common import EXIT_OK, Commands, add_command, add_json, check_queue, declaration_of, print_json
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.groups import failure_groups
from poison_pipeline.text.groups import groups_table


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "groups", "failures of poison, dead_letter and quarantine grouped by error signature",
        "Group the messages in poison, dead_letter and quarantine by error signature: error type,\n"
        "message with numbers, ids and quoted values blanked (<n>, <id>, <str>) and the innermost\n"
        "frame of the handler's own code. Messages without an error (expired, conversation\n"
        "ended) group by their dead-letter reason. Per group: its id (8 characters, stable; the\n"
        "same failure in two queues or tables has the same id), count, first and last failure\n"
        "time, message types and three example message ids (the latest). Biggest group first.\n"
        "Reads narrow columns with delta-rs; changes nothing. Listing no group is a success.",
        run,
    )
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue (default: all)")
    sub.add_argument("--table", "-t", choices=FAILURE_TABLES, default=None,
                     help="only this table (default: all three)")
    add_json(sub, "a table")


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    if args.queue is not None:
        check_queue(declaration, args.queue)
    now = datetime.now(UTC)
    groups = failure_groups(declaration, args.queue, args.table)
    if args.json:
        print_json({"checked_at": now, "groups": [asdict(g) for g in groups]})
    elif not groups:
        tables = args.table or ", ".join(FAILURE_TABLES)
        queues = repr(args.queue) if args.queue else ", ".join(declaration.queues)
        print(f"no failures: {tables} of queue(s) {queues} hold no message")
    else:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console.width = 160  # piped or redirected: no terminal to fit, keep lines whole
        console.print(groups_table(groups))
    return EXIT_OK
