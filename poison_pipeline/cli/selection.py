"""The filters of the commands that select failed messages (`redrive`, `purge`): all must hold."""

from __future__ import annotations

import argparse
from pathlib import Path

from poison_pipeline.cli.common import UsageError, moment
from poison_pipeline.operations.selection import Selection


def add_selection_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--group", metavar="ID", help="a failure group id (see `groups`)")
    sub.add_argument("--error-type", metavar="TYPE", help="last error type, e.g. ValueError or PartObsolete")
    sub.add_argument("--message-type", metavar="TYPE")
    sub.add_argument("--conversation", metavar="ID")
    sub.add_argument("--failed-after", metavar="TIME", type=moment, help="ISO 8601; failed at or after")
    sub.add_argument("--failed-before", metavar="TIME", type=moment, help="ISO 8601; failed before")
    sub.add_argument("--ids", metavar="FILE", help="a file of message ids, one a line")
    sub.add_argument("--where", metavar="EXPR",
                     help="a predicate over the table's columns: = != < <= > >=, IN (...), LIKE, IS [NOT] NULL, "
                          "BETWEEN, AND, OR, NOT, parentheses (no SQL beyond these)")


def selection(args: argparse.Namespace) -> Selection:
    ids = None
    if args.ids is not None:
        try:
            ids = tuple(line.strip() for line in Path(args.ids).read_bytes().decode("utf-8").splitlines()
                        if line.strip())
        except OSError as error:
            raise UsageError(f"--ids {args.ids}: {error.strerror}") from None
        except UnicodeDecodeError as error:  # no message id is anything but UTF-8 text
            raise UsageError(f"--ids {args.ids}: not UTF-8 text (byte {error.start})") from None
    return Selection(args.group, args.error_type, args.message_type, args.conversation, args.failed_after,
                     args.failed_before, ids, args.where)
