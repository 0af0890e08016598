"""`maintain QUEUE [--retention 7d] [--no-vacuum] [--json]`: compact, checkpoint and vacuum a queue's tables."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import timedelta

from poison_pipeline.cli.common import (
    EXIT_OK,
    Commands,
    UsageError,
    add_command,
    add_json,
    check_queue,
    declaration_of,
    print_json,
)
from poison_pipeline.domain.durations import parse_duration
from poison_pipeline.operations.maintenance import DEFAULT_RETENTION, RetentionTooShort, maintain
from poison_pipeline.text.maintenance import format_maintained


def _duration(text: str) -> timedelta:
    try:
        duration = parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if duration < timedelta(0):
        raise argparse.ArgumentTypeError(f"{text!r}: a retention must not be negative")
    return duration


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "maintain", "compact, checkpoint and vacuum a queue's tables",
        "Under the queue's lease (no cycle or operator command runs meanwhile), rewrite the small\n"
        "files of every table of QUEUE into large ones, write a checkpoint of each Delta log, and\n"
        "delete the files no version younger than the retention reads. Versions an undo may still\n"
        "read (those recorded by redrives, edits, purges, archives and restores not undone) keep\n"
        "their files, and a table whose cycle was interrupted is left alone until a cycle recovers\n"
        "it. The retention is rounded up to whole hours (delta-rs vacuums in hours) and may not be\n"
        "shorter than the queue's lease.expiry (exit 2, nothing done).",
        run,
    )
    sub.add_argument("queue", metavar="QUEUE", help="the application queue to maintain")
    sub.add_argument("--retention", type=_duration, default=DEFAULT_RETENTION, metavar="DURATION",
                     help="keep the files of versions younger than this (7d, 12h, PT1H; rounded up to whole "
                          "hours, at least lease.expiry); default: 7 days")
    sub.add_argument("--no-vacuum", action="store_true", help="compact and checkpoint only; delete no file")
    add_json(sub)


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    check_queue(declaration, args.queue)
    try:
        result = maintain(declaration, args.queue, vacuum=not args.no_vacuum, retention=args.retention)
    except RetentionTooShort as error:
        raise UsageError(f"--retention {error}") from None
    if args.json:
        print_json(asdict(result))
    else:
        print(format_maintained(result))
    return EXIT_OK
