"""`status [--queue Q] [--json]`: counts, oldest age and due messages per queue and table."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime

from poison_pipeline.cli.common import (
    EXIT_OK,
    Commands,
    add_command,
    add_json,
    check_queue,
    code_problems_of,
    code_warning,
    declaration_of,
    print_json,
)
from poison_pipeline.operations.status import queue_status, undeclared_statuses
from poison_pipeline.text.status import format_status


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "status", "counts, oldest age and due messages per queue and table; enabled or disabled",
        "For each queue: ENABLED or DISABLED (with reason, who and since when), then per table\n"
        "(inbound, retry_k, poison, dead_letter, quarantine, processed, attempts) its rows, the\n"
        "age of its oldest row and, for waiting tables, how many are due and when the next is;\n"
        "the messages purged for good, per table they were purged from; then how many\n"
        "conversations were ended with an error (end-conversation), if any. Without --queue,\n"
        "also every queue the lake holds messages of that the declaration no longer names\n"
        "(NOT DECLARED: removed or renamed while they waited), with what to do.\n"
        "Then a line per queue whose handler (or other code it names) does not import in this\n"
        "Python environment: its cycles cannot run until it does (exit code still 0).\n"
        "Reads the Delta logs only (plus one narrow column where a file mixes reasons or\n"
        "dispositions); changes nothing.",
        run,
    )
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue (default: all)")
    add_json(sub, "tables")


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    queues = list(declaration.queues)
    if args.queue is not None:
        check_queue(declaration, args.queue)
        queues = [args.queue]
    now = datetime.now(UTC)
    statuses = [queue_status(declaration, queue, now) for queue in queues]
    if args.queue is None:  # and the queues the lake holds messages of that are no longer declared
        statuses += undeclared_statuses(declaration, now)
    broken = code_problems_of(declaration, queues)
    if args.json:
        print_json({"checked_at": now, "queues": [asdict(s) for s in statuses],
                    "code_problems": {queue: list(problem.lines) for queue, problem in broken.items()}})
    else:
        print(format_status(statuses))
        for problem in broken.values():
            print(code_warning(problem))
    return EXIT_OK
