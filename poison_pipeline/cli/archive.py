"""`archive QUEUE --table T [filters]` and `restore QUEUE --table T [filters]`: a reversible "known,
ignore it" state for failed messages."""

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
    complain,
    declaration_of,
    print_json,
)
from poison_pipeline.cli.requests import add_field, request_of
from poison_pipeline.cli.selection import add_selection_arguments, ids_of
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.archive import (
    ARCHIVE,
    ArchiveError,
    ArchiveRequest,
    RestoreRequest,
    archive,
    restore,
)
from poison_pipeline.operations.requests import ActionContext
from poison_pipeline.operations.selection import SelectionError
from poison_pipeline.text.archive import format_archive

_WHAT: dict[str, tuple[str, str, type[ArchiveRequest] | type[RestoreRequest]]] = {
    ARCHIVE: ("archive failed messages: known, left out of groups, checks and alerts; reversible",
              "Archive the messages of QUEUE's poison, dead_letter or quarantine table that match the\n"
              "filters (all must hold): they stay in their table, readable by `inspect` and `history`,\n"
              "but leave the failure groups, the checks, the alerts and the selections of redrive and\n"
              "purge; the conservation line counts them as archived. `restore` brings them back,\n"
              "`undo` reverses the action, and a declared `retention: {archived: AGE}` purges them.",
              ArchiveRequest),
    "restore": ("restore archived messages: failures like any other again",
                "Restore the archived messages of QUEUE's poison, dead_letter or quarantine table that\n"
                "match the filters (all must hold): they are in the failure groups, checks and\n"
                "selections again. `undo` reverses the action.",
                RestoreRequest),
}


def add_parser(commands: Commands) -> None:
    for kind, (summary, description, model) in _WHAT.items():
        sub = add_command(commands, kind, summary, description, run)
        add_field(sub, model, "queue", metavar="QUEUE")
        add_field(sub, model, "table", "--table", required=True, choices=FAILURE_TABLES)
        add_selection_arguments(sub, model)
        add_field(sub, model, "dry_run", "--dry-run", action="store_true")
        add_field(sub, model, "id", "--id", metavar="ID")
        add_actor(sub)
        add_json(sub)


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    context = ActionContext(actor=args.actor)
    try:
        if args.command == ARCHIVE:
            result = archive(declaration, request_of(ArchiveRequest, args, **ids_of(args)), context)
        else:
            result = restore(declaration, request_of(RestoreRequest, args, **ids_of(args)), context)
    except (ArchiveError, SelectionError) as error:
        raise UsageError(str(error)) from None
    if args.json:
        print_json(asdict(result))
    else:
        print(format_archive(result))
    if not result.count and not result.already_done:
        complain(args, f"nothing to {args.command}: no {'archived ' if args.command != ARCHIVE else ''}message in "
                       f"{result.queue}/{result.table} matches the filters")
        return EXIT_INCOMPLETE
    return EXIT_OK
