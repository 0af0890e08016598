"""`enqueue FILE.jsonl --queue Q`: validate a JSON Lines file and enqueue its valid messages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from poison_pipeline.cli.common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    PROG,
    Commands,
    UsageError,
    add_command,
    check_queue,
    code_problems_of,
    code_warning,
    complain,
    declaration_of,
)
from poison_pipeline.operations.enqueue import enqueue_data, reasons_path, refused_path, write_refused


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "enqueue", "validate a JSON Lines file and enqueue its valid messages",
        "Validate every line of FILE (one envelope per line: message_id, message_type, body or\n"
        "body_base64, encoding, conversation_id, sequence_number, enqueued_at, expires_at,\n"
        "sender, headers) and append the valid ones to the queue's inbound table in one commit.\n"
        "Each refused line is reported with its line number, message id and reason, and copied\n"
        "as it was to FILE.refused.jsonl beside the input (the .jsonl suffix replaced), so nothing\n"
        "is lost; FILE.refused.reasons.jsonl holds, line for line, why: {\"line\", \"refused_line\",\n"
        "\"message_id\", \"reason\"}.\n"
        "When the queue's handler (or other code it names) does not import here, the messages are\n"
        "still enqueued (they wait until it does) and a warning says so on stderr.",
        run,
    )
    sub.add_argument("file", metavar="FILE.jsonl",
                     help="JSON Lines file of envelopes; blank lines are skipped")
    sub.add_argument("--queue", "-q", required=True, metavar="QUEUE",
                     help="application queue to enqueue into (required)")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a JSON Lines file") from None
    except PermissionError:
        raise UsageError(f"{path}: permission denied") from None


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    check_queue(declaration, args.queue)
    path = Path(args.file)
    result = enqueue_data(declaration, args.queue, _read(path))
    batch = f" (batch {result.batch_id})" if result.batch_id else ""
    print(f"enqueued {result.accepted} of {result.lines} messages into queue {args.queue!r}{batch}")
    for problem in code_problems_of(declaration, [args.queue]).values():
        complain(args, f"warning: {code_warning(problem)}")
    if not result.refused:
        return EXIT_OK
    for refusal in result.refused:
        who = f"message_id {refusal.message_id!r}: " if refusal.message_id is not None else ""
        print(f"{path}: line {refusal.line.number}: {who}{refusal.error}", file=sys.stderr)
    target = refused_path(path)
    try:
        write_refused(target, result.refused)
    except OSError as error:
        print(f"{PROG} enqueue: error: could not write the refused lines to {target}: {error}; "
              f"they are still in {path}", file=sys.stderr)
        return EXIT_INCOMPLETE
    print(f"refused {len(result.refused)}; the refused lines are in {target}, their reasons in "
          f"{reasons_path(target)}")
    return EXIT_INCOMPLETE
