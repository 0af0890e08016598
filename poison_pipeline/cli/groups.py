"""`groups [--queue Q] [--table T] [--since WHEN] [--until WHEN] [--json]`: failures of poison,
dead_letter and quarantine by signature;
`groups note GROUP_ID TEXT [--owner NAME] [--queue Q]`: a note on a group."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from datetime import UTC, datetime

from rich.console import Console

from poison_pipeline.cli.common import (
    EXIT_CODES,
    EXIT_OK,
    Commands,
    UsageError,
    add_actor,
    add_command,
    add_json,
    check_queue,
    declaration_of,
    moment_or_age,
    print_json,
)
from poison_pipeline.cli.requests import add_field, request_of
from poison_pipeline.domain.durations import when
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.groups import UnknownGroup, Window, failure_groups
from poison_pipeline.operations.notes import NoteRequest, note_group
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.text.groups import groups_table


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "groups", "failures of poison, dead_letter and quarantine grouped by error signature",
        "Group the messages in poison, dead_letter and quarantine by error signature: error type,\n"
        "message with numbers, ids and quoted values blanked (<n>, <id>, <str>) and the innermost\n"
        "frame of the handler's own code. Messages without an error (expired, conversation\n"
        "ended) group by their dead-letter reason. Per group: its id (8 characters, stable; the\n"
        "same failure in two queues or tables has the same id), count, first and last failure\n"
        "time, message types and three example message ids (the latest), and its note. Biggest\n"
        "group first. Each id is shown with the version of the table read (id@version): given so\n"
        "to redrive or purge, it takes only what that version held. Reads narrow columns with\n"
        "delta-rs; changes nothing. Listing no group is a success. With --since (and --until),\n"
        "only the messages that failed in that window count: `groups --since 1h` answers how many\n"
        "failed in the last hour, and why (failure time: when the message reached its table).\n"
        "`groups note GROUP_ID TEXT` records a note on a group (who owns it, what is known).",
        run,
    )
    verbs = sub.add_subparsers(dest="verb", metavar="note", required=False)
    note = verbs.add_parser("note", help="record a note on a failure group", description=(
        "Record a note on GROUP_ID in the actions ledger of each queue that holds it (or --queue's);\n"
        "`groups` shows a group's newest note."), epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_field(note, NoteRequest, "group", metavar="GROUP_ID")
    add_field(note, NoteRequest, "text", metavar="TEXT")
    add_field(note, NoteRequest, "owner", "--owner", metavar="NAME")
    add_field(note, NoteRequest, "queue", "--queue", "-q", metavar="QUEUE")
    add_actor(note)
    add_json(note)
    note.set_defaults(run=run_note)
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue (default: all)")
    sub.add_argument("--table", "-t", choices=FAILURE_TABLES, default=None,
                     help="only this table (default: all three)")
    sub.add_argument("--since", metavar="WHEN", type=moment_or_age, default=None,
                     help="only messages that failed at or after WHEN: an age (1h, 30m, 7d) or an ISO 8601 "
                          "time (default: all)")
    sub.add_argument("--until", metavar="WHEN", type=moment_or_age, default=None,
                     help="only messages that failed before WHEN (an age or a time, as --since)")
    add_json(sub, "a table")


def run_note(args: argparse.Namespace) -> int:
    request = request_of(NoteRequest, args)
    declaration = declaration_of(args)
    if request.queue is not None:
        check_queue(declaration, request.queue)
    try:
        result = note_group(declaration, request, ActionContext(actor=args.actor))
    except UnknownGroup as error:
        raise UsageError(str(error)) from None
    if args.json:
        print_json(asdict(result))
    else:
        print(f"noted group {result.group} in " + ", ".join(f"{q} ({a})" for q, a in result.action_ids.items()))
    return EXIT_OK


def _window_text(window: Window) -> str:
    bounds = [f" failed since {when(window.since)}" if window.since else "",
              f" failed before {when(window.until)}" if window.until else ""]
    return " that" + " and".join(b for b in bounds if b) if any(bounds) else ""


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    if args.queue is not None:
        check_queue(declaration, args.queue)
    now = datetime.now(UTC)
    try:
        window = Window(since=args.since, until=args.until)
    except ValueError as error:
        raise UsageError(f"--since/--until: {error}") from None
    groups = failure_groups(declaration, args.queue, args.table, window=window)
    if args.json:
        print_json({"checked_at": now, "since": window.since, "until": window.until,
                    "groups": [asdict(g) for g in groups]})
    elif not groups:
        tables = args.table or ", ".join(FAILURE_TABLES)
        queues = repr(args.queue) if args.queue else ", ".join(declaration.queues)
        print(f"no failures: {tables} of queue(s) {queues} hold no message{_window_text(window)}")
    else:
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console.width = 160  # piped or redirected: no terminal to fit, keep lines whole
        console.print(groups_table(groups))
    return EXIT_OK
