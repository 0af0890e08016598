"""The `poison-pipeline` command line for operators (SPEC section 8).

Exit codes: 0 success; 1 the command ran but not everything went through (lines refused, message not
found, storage failure); 2 usage or configuration errors; 3 the queue is busy (another run held its
lease for longer than `lease.wait`). A user mistake is one line on stderr,
never a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

from deltalake.exceptions import DeltaError
from rich.console import Console
from rich.progress import Progress

from poison_pipeline.broker.conversations import (
    CONVERSATION_ENDED,
    EndResult,
    check_end_request,
    conversation_queues,
)
from poison_pipeline.domain.conversation_errors import ConversationError
from poison_pipeline.domain.declaration import CONFIG_ENV, Declaration, DeclarationError, load_declaration
from poison_pipeline.domain.durations import parse_duration
from poison_pipeline.domain.envelope import EnvelopeError, parse_envelope
from poison_pipeline.domain.policy import Policy
from poison_pipeline.domain.routing import FAILURE_TABLES
from poison_pipeline.operations.actions import default_actor, format_actions, list_actions
from poison_pipeline.operations.edit import EditError, EditNotFound, edit, format_edit
from poison_pipeline.operations.enable import enable
from poison_pipeline.operations.end_conversation import end_conversation_by_operator
from poison_pipeline.operations.groups import failure_groups, groups_table
from poison_pipeline.operations.history import format_history, history
from poison_pipeline.operations.inspect_message import AsOfError, format_inspection, inspect_message
from poison_pipeline.operations.purge import PurgeError, PurgeResult, format_purge, purge
from poison_pipeline.operations.purge import result_json as purge_json
from poison_pipeline.operations.redrive import RedriveError, format_redrive, redrive
from poison_pipeline.operations.selection import Selection, SelectionError
from poison_pipeline.operations.status import format_status, format_time, queue_status
from poison_pipeline.operations.undo import UndoError, undo
from poison_pipeline.storage.control import StateNotRecorded
from poison_pipeline.storage.enqueue import enqueue
from poison_pipeline.storage.lease import LeaseHeld

PROG = "poison-pipeline"
EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3


class UsageError(Exception):
    """A mistake in what the user asked for: one line on stderr, exit code 2."""


def _declaration(args: argparse.Namespace) -> Declaration:
    return load_declaration(args.config)


def _check_queue(declaration: Declaration, queue: str) -> None:
    if queue not in declaration.queues:
        raise UsageError(f"no queue {queue!r} is declared; declared: {', '.join(declaration.queues)}")


def _json_value(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _print_json(data: object) -> None:
    print(json.dumps(data, default=_json_value, indent=2, ensure_ascii=False))


@dataclass(frozen=True)
class _Line:
    number: int
    raw: bytes


def _read_lines(path: Path) -> list[_Line]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a JSON Lines file") from None
    except PermissionError:
        raise UsageError(f"{path}: permission denied") from None
    # Split on "\n" only, so line numbers match what an editor shows.
    return [_Line(n, raw) for n, raw in enumerate(data.split(b"\n"), start=1) if raw.strip()]


def refused_path(path: Path) -> Path:
    """`orders.jsonl` -> `orders.refused.jsonl`, beside the input; never the input itself."""
    stem = path.name.removesuffix(".jsonl")
    return path.with_name(f"{stem}.refused.jsonl")


def _screen(raw: bytes, policy: Policy, now: datetime) -> tuple[str | None, object, str | None]:
    """The line as text, or why it cannot even be handed to `enqueue`.

    `enqueue` reports envelope errors itself; this catches what would make it fail for the whole
    file instead (bytes that are not UTF-8, escaped lone surrogates, dates out of range, nesting
    too deep), so one bad line never blocks the good ones.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, None, (f"not valid UTF-8 at byte {error.start} (send binary bodies base64-encoded "
                            "in body_base64 with encoding 'binary')")
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return text, None, None  # enqueue refuses it with its own message
    except (ValueError, RecursionError) as error:
        return None, None, f"not valid JSON ({type(error).__name__}: {error})"
    message_id = record.get("message_id") if isinstance(record, dict) else None
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError, ValueError) as error:
        return None, message_id, f"cannot be stored as UTF-8 text ({type(error).__name__}: {error})"
    try:
        parse_envelope(record, now, policy.time_to_live, policy.max_body_bytes)
    except EnvelopeError:
        return text, message_id, None
    except (ArithmeticError, ValueError, TypeError, RecursionError) as error:
        return None, message_id, f"cannot be enqueued ({type(error).__name__}: {error})"
    return text, message_id, None


def _enqueue(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    _check_queue(declaration, args.queue)
    path = Path(args.file)
    lines = _read_lines(path)
    now = datetime.now(UTC)
    policy = declaration.queue(args.queue).policy
    refused: list[tuple[_Line, object, str]] = []
    texts: list[str] = []
    origins: list[_Line] = []
    for line in lines:
        text, message_id, problem = _screen(line.raw, policy, now)
        if text is None:
            refused.append((line, message_id, problem or "refused"))
            continue
        texts.append(text)
        origins.append(line)
    result = enqueue(declaration, args.queue, texts, now=now)
    refused.extend((origins[r.line - 1], r.message_id, r.error) for r in result.refused)
    refused.sort(key=lambda item: item[0].number)
    batch = f" (batch {result.batch_id})" if result.batch_id else ""
    print(f"enqueued {result.accepted} of {len(lines)} messages into queue {args.queue!r}{batch}")
    if not refused:
        return EXIT_OK
    for line, message_id, error in refused:
        who = f"message_id {message_id!r}: " if message_id is not None else ""
        print(f"{path}: line {line.number}: {who}{error}", file=sys.stderr)
    target = refused_path(path)
    try:
        _write_atomically(target, b"".join(line.raw.rstrip(b"\r") + b"\n" for line, _, _ in refused))
    except OSError as error:
        print(f"{PROG} enqueue: error: could not write the refused lines to {target}: {error}; "
              f"they are still in {path}", file=sys.stderr)
        return EXIT_INCOMPLETE
    print(f"refused {len(refused)}; the refused lines are in {target}")
    return EXIT_INCOMPLETE


def _write_atomically(target: Path, data: bytes) -> None:
    # A reader (or a re-run) never sees half a file of refused lines.
    partial = target.with_name(target.name + ".tmp")
    partial.write_bytes(data)
    partial.replace(target)


def _status(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    queues = list(declaration.queues)
    if args.queue is not None:
        _check_queue(declaration, args.queue)
        queues = [args.queue]
    now = datetime.now(UTC)
    statuses = [queue_status(declaration, queue, now) for queue in queues]
    if args.json:
        _print_json({"checked_at": now, "queues": [asdict(s) for s in statuses]})
    else:
        print(format_status(statuses))
    return EXIT_OK


def _groups(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    if args.queue is not None:
        _check_queue(declaration, args.queue)
    now = datetime.now(UTC)
    groups = failure_groups(declaration, args.queue, args.table)
    if args.json:
        _print_json({"checked_at": now, "groups": [asdict(g) for g in groups]})
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

def _as_of(text: str) -> int | datetime:
    if text.isdigit():
        return int(text)
    try:
        return _moment(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a table version (a number) nor an ISO 8601 "
                                         "time (e.g. 2026-11-22T10:00Z)") from None


def _inspect(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    if args.queue is not None:
        _check_queue(declaration, args.queue)
    try:
        found = inspect_message(declaration, args.message_id, args.as_of, args.queue, args.table)
    except AsOfError as error:
        raise UsageError(str(error)) from None
    if found is None:
        when_ = "" if args.as_of is None else f" as of {args.as_of}"
        print(f"{PROG} inspect: message {args.message_id!r} is in no table of queues "
              f"{', '.join(declaration.queues)}{when_}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if args.json:
        _print_json(asdict(found))
    else:
        print(format_inspection(found, datetime.now(UTC), stacks=args.stack))
    return EXIT_OK


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--header {text!r}: write it as KEY=VALUE")
    return key, value


def _edit(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    try:
        body = Path(args.body_file).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"--body-file {args.body_file}: no such file") from None
    except OSError as error:
        raise UsageError(f"--body-file {args.body_file}: {error.strerror}") from None
    try:
        result = edit(declaration, args.message_id, body, dict(args.header or []), queue=args.queue,
                      source=args.source, edit_id=args.id, actor=args.actor)
    except EditError as error:
        raise UsageError(str(error)) from None
    except EditNotFound as error:
        print(f"{PROG} edit: {error}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if args.json:
        _print_json(asdict(result))
    else:
        print(format_edit(result))
    return EXIT_OK


def _history(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    journey = history(declaration, args.message_id)
    if not journey.events:
        print(f"{PROG} history: message {args.message_id!r} is in no table of queues "
              f"{', '.join(declaration.queues)}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if args.json:
        _print_json(asdict(journey))
    else:
        print(format_history(journey))
    return EXIT_OK


def _enable(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    _check_queue(declaration, args.queue)
    result = enable(declaration, args.queue, args.actor, args.reason)
    if not result.changed:
        print(f"queue {args.queue!r} is already enabled; its state is unchanged (action {result.action.action_id})")
        return EXIT_OK
    before = result.before
    print(f"queue {args.queue!r} enabled by {args.actor}: {args.reason} (action {result.action.action_id})")
    print(f"  it was disabled since {format_time(before.since)} by {before.actor}: {before.reason}")
    return EXIT_OK


def _rate(text: str) -> float:
    try:
        return float(text.removesuffix("/s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate: write messages per second, e.g. 50/s") from None


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-22T10:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _add_selection_arguments(sub: argparse.ArgumentParser) -> None:
    """The filters of the commands that select failed messages (redrive, purge); see `_selection`."""
    sub.add_argument("--group", metavar="ID", help="a failure group id (see `groups`)")
    sub.add_argument("--error-type", metavar="TYPE", help="last error type, e.g. ValueError or PartObsolete")
    sub.add_argument("--message-type", metavar="TYPE")
    sub.add_argument("--conversation", metavar="ID")
    sub.add_argument("--failed-after", metavar="TIME", type=_moment, help="ISO 8601; failed at or after")
    sub.add_argument("--failed-before", metavar="TIME", type=_moment, help="ISO 8601; failed before")
    sub.add_argument("--ids", metavar="FILE", help="a file of message ids, one a line")
    sub.add_argument("--where", metavar="EXPR", help="a SQL predicate over the table's columns")


def _age(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _selection(args: argparse.Namespace) -> Selection:
    ids = None
    if args.ids is not None:
        try:
            ids = tuple(line.strip() for line in Path(args.ids).read_text().splitlines() if line.strip())
        except OSError as error:
            raise UsageError(f"--ids {args.ids}: {error.strerror}") from None
    return Selection(args.group, args.error_type, args.message_type, args.conversation, args.failed_after,
                     args.failed_before, ids, args.where)


@contextlib.contextmanager
def _progress_bar(what: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr when it is a terminal; nothing otherwise (pipes, logs, tests)."""
    if not sys.stderr.isatty():
        yield None
        return
    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _redrive(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    try:
        with _progress_bar("redriving") as progress:
            result = redrive(declaration, args.queue, args.source, _selection(args), to=args.to,
                             dry_run=args.dry_run, rate=args.rate, limit=args.limit, redrive_id=args.id,
                             force=args.force, actor=args.actor, progress=progress)
    except (RedriveError, SelectionError) as error:
        raise UsageError(str(error)) from None
    if args.json:
        _print_json(asdict(result))
    else:
        print(format_redrive(result))
    if not result.moved and not result.already_done:
        print(f"{PROG} redrive: nothing to move: {result.selected} message(s) selected in "
              f"{args.queue}/{args.source}", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_OK


def _purge(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    selection, now = _selection(args), datetime.now(UTC)  # one cutoff for the preview and the purge
    try:
        if not args.yes:
            preview = purge(declaration, args.queue, args.table, args.older_than, selection, dry_run=True,
                            purge_id=args.id, actor=args.actor, now=now)
            if not preview.purged:
                return _nothing_to_purge(args, preview)
            _show_purge(args, preview)
            if not sys.stdin.isatty():
                print(f"{PROG} purge: refusing to delete {preview.purged} message(s) without --yes "
                      "(stdin is not a terminal to confirm on); nothing deleted", file=sys.stderr)
                return EXIT_INCOMPLETE
            print(f"Delete {preview.purged} messages for good? [y/N] ", end="", file=sys.stderr, flush=True)
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print(f"{PROG} purge: not confirmed; nothing deleted", file=sys.stderr)
                return EXIT_INCOMPLETE
        result = purge(declaration, args.queue, args.table, args.older_than, selection, purge_id=args.id,
                       actor=args.actor, now=now)
    except (PurgeError, SelectionError) as error:
        raise UsageError(str(error)) from None
    if not result.purged and not result.already_done:
        return _nothing_to_purge(args, result)
    _show_purge(args, result)
    return EXIT_OK


def _show_purge(args: argparse.Namespace, result: PurgeResult) -> None:
    if args.json:
        _print_json(purge_json(result))
    else:
        print(format_purge(result))


def _nothing_to_purge(args: argparse.Namespace, result: PurgeResult) -> int:
    if args.json:
        _print_json(purge_json(result))
    print(f"{PROG} purge: nothing to purge: no message in {args.queue}/{args.table} failed before "
          f"{result.cutoff.isoformat()} and matches the filters", file=sys.stderr)
    return EXIT_INCOMPLETE


def _undo(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    try:
        result = undo(declaration, args.action_id, actor=args.actor)
    except UndoError as error:
        raise UsageError(str(error)) from None
    if args.json:
        _print_json(asdict(result))
    elif result.already_undone:
        print(f"action {args.action_id} was undone already: nothing changed")
    else:
        print(f"undid {result.kind} {args.action_id} by {result.how} ({result.undo_id}): "
              f"{result.restored} message(s) back where they were")
        if result.unrecoverable:
            named = ", ".join(result.unrecoverable[:10]) + (" ..." if len(result.unrecoverable) > 10 else "")
            print(f"  {len(result.unrecoverable)} could not be brought back (they moved on since: processed or "
                  f"failed again): {named}")
    return EXIT_INCOMPLETE if result.unrecoverable else EXIT_OK


def _actions(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    if args.queue is not None:
        _check_queue(declaration, args.queue)
    found = list_actions(declaration, args.queue)
    if args.json:
        _print_json([asdict(a) for a in found])
    else:
        print(format_actions(found))
    return EXIT_OK


def _end_conversation(args: argparse.Namespace) -> int:
    declaration = _declaration(args)
    queues = [args.queue] if args.queue is not None else list(declaration.queues)
    try:
        for queue in queues:
            check_end_request(declaration, queue, args.conversation_id, args.code, args.description, args.actor)
    except ConversationError as error:
        raise UsageError(str(error)) from None
    if args.queue is None:
        queues = conversation_queues(declaration, args.conversation_id)
        if not queues:
            print(f"{PROG} end-conversation: conversation {args.conversation_id!r} has no messages, ledger "
                  f"rows or recorded end in queues {', '.join(declaration.queues)}; name a queue with "
                  "--queue to end it there anyway", file=sys.stderr)
            return EXIT_INCOMPLETE
    now = datetime.now(UTC)
    results = [end_conversation_by_operator(declaration, queue, args.conversation_id, args.code,
                                            args.description, args.actor, now).result for queue in queues]
    if args.json:
        _print_json([{**asdict(r), "kind": r.kind, "removed_total": r.removed_total} for r in results])
    else:
        print("\n".join(_format_end(r, args.code, args.description) for r in results))
    failed = [r for r in results if r.hook_error is not None]
    for result in failed:
        print(f"{PROG} end-conversation: error: queue {result.queue!r}: clean-up hook {result.hook} failed: "
              f"{result.hook_error}; the conversation is ended, run the command again to retry the hook",
              file=sys.stderr)
    return EXIT_INCOMPLETE if failed else EXIT_OK


def _format_end(result: EndResult, code: int, description: str) -> str:
    what = f"with code {result.code} ({result.kind}): {result.description}"
    if result.already_ended:
        head = (f"conversation {result.conversation_id!r} in queue {result.queue!r}: already ended at "
                f"{format_time(result.ended_at)} by {result.actor} {what}; not recorded again")
    else:
        head = f"conversation {result.conversation_id!r} in queue {result.queue!r}: ended by {result.actor} {what}"
    lines = [head]
    if result.already_ended and (code, description) != (result.code, result.description):
        lines.append(f"  note: code {code} and description {description!r} given now are not recorded; "
                     "the first end stands")
    moved = ", ".join(f"{table} {count}" for table, count in result.removed.items())
    lines.append(f"  moved to dead_letter (reason {CONVERSATION_ENDED}): {moved} ({result.removed_total} in all)")
    if result.unsent:
        senders = ", ".join(f"{queue} {count}" for queue, count in result.unsent.items())
        lines.append(f"  not sent (pending sends on it, now in each sender's dead_letter): {senders}")
    lines.append(f"  notified: {', '.join(result.notified)} (conversation_error)" if result.notified
                 else "  notified: nobody new (no sender known, or all told before)")
    if result.hook is None:
        lines.append("  clean-up hook: none declared (on_conversation_end)")
    elif result.hook_error is not None:
        lines.append(f"  clean-up hook {result.hook}: FAILED: {result.hook_error}")
    else:
        state = "ran" if result.hook_ran else "already ran; not run again"
        lines.append(f"  clean-up hook {result.hook}: {state}")
    return "\n".join(lines)


_EXIT_CODES = """exit codes:
  0  success
  1  the command ran but not everything went through (refused lines, message or
     conversation not found, a clean-up hook failed, storage failure; nothing selected
     to redrive or purge, or a purge not confirmed)
  2  usage or configuration error (unknown queue, missing file, invalid declaration,
     invalid error code or description)
  3  the queue is busy: another run held its lease for longer than lease.wait
     (the error names it: run id, host, pid, since when)"""


def build_parser() -> argparse.ArgumentParser:
    config_help = (
        f"declaration file (YAML); default: ${CONFIG_ENV} if set, else ./poison_pipeline.yaml"
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate poison_pipeline queues: enqueue messages, see their status, group the "
                    "failures, inspect a message, end a conversation with an error, re-enable a "
                    "disabled queue.",
        epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", default=None, help=config_help)
    # Also accepted after the command (`poison-pipeline status --config x.yaml`); SUPPRESS keeps
    # the subcommand from overwriting a --config given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=config_help)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, summary: str, description: str,
                run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=description, epilog=_EXIT_CODES,
                                  parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(run=run)
        return sub

    sub = command(
        "enqueue", "validate a JSON Lines file and enqueue its valid messages",
        "Validate every line of FILE (one envelope per line: message_id, message_type, body or\n"
        "body_base64, encoding, conversation_id, sequence_number, enqueued_at, expires_at,\n"
        "sender, headers) and append the valid ones to the queue's inbound table in one commit.\n"
        "Each refused line is reported with its line number, message id and reason, and copied\n"
        "to FILE.refused.jsonl beside the input (the .jsonl suffix replaced), so nothing is lost.",
        _enqueue,
    )
    sub.add_argument("file", metavar="FILE.jsonl",
                     help="JSON Lines file of envelopes; blank lines are skipped")
    sub.add_argument("--queue", "-q", required=True, metavar="QUEUE",
                     help="application queue to enqueue into (required)")

    sub = command(
        "status", "counts, oldest age and due messages per queue and table; enabled or disabled",
        "For each queue: ENABLED or DISABLED (with reason, who and since when), then per table\n"
        "(inbound, retry_k, poison, dead_letter, quarantine, processed, attempts) its rows, the\n"
        "age of its oldest row and, for waiting tables, how many are due and when the next is;\n"
        "then how many conversations were ended with an error (end-conversation), if any.\n"
        "Reads the Delta logs only (plus one narrow column where a file mixes reasons or\n"
        "dispositions); changes nothing.",
        _status,
    )
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue (default: all)")
    sub.add_argument("--json", action="store_true", help="print JSON instead of tables")

    sub = command(
        "groups", "failures of poison, dead_letter and quarantine grouped by error signature",
        "Group the messages in poison, dead_letter and quarantine by error signature: error type,\n"
        "message with numbers, ids and quoted values blanked (<n>, <id>, <str>) and the innermost\n"
        "frame of the handler's own code. Messages without an error (expired, conversation\n"
        "ended) group by their dead-letter reason. Per group: its id (8 characters, stable; the\n"
        "same failure in two queues or tables has the same id), count, first and last failure\n"
        "time, message types and three example message ids (the latest). Biggest group first.\n"
        "Reads narrow columns with delta-rs; changes nothing. Listing no group is a success.",
        _groups,
    )
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue (default: all)")
    sub.add_argument("--table", "-t", choices=FAILURE_TABLES, default=None,
                     help="only this table (default: all three)")
    sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub = command(
        "inspect", "show one message: where it is, counts, body and every attempt",
        "Find MESSAGE_ID in every queue's waiting tables, dead-letter, quarantine and processed\n"
        "ledger; show where it is, its abort/total abort/move counts, due time, last error, its\n"
        "body rendered by encoding (json pretty-printed, xml and text as text, binary or\n"
        "undecodable bodies as hex; never evaluated) and its whole attempt history. Changes\n"
        "nothing. With --json the raw body is included base64-encoded as raw_body.",
        _inspect,
    )
    sub.add_argument("message_id", metavar="MESSAGE_ID", help="the message's message_id")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub.add_argument("--stack", action="store_true", help="also print the stack trace of every error")
    sub.add_argument("--as-of", metavar="VERSION|TIME", type=_as_of, default=None,
                     help="show the copy a table held then (Delta time travel): a version of --table, or "
                          "an ISO 8601 time (every table as it was then)")
    sub.add_argument("--table", metavar="TABLE", default=None,
                     help="only this table (inbound, retry_k, poison, dead_letter, quarantine, processed, "
                          "attempts); required with --as-of VERSION")
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue")

    sub = command(
        "edit", "replace a failed message's body (and headers) and send it back to its inbound",
        "Replace the body of MESSAGE_ID, found in its queue's poison, dead_letter or quarantine\n"
        "table, with the bytes of --body-file (checked against the message's encoding and the\n"
        "queue's max_body_bytes; refused, with nothing changed, if invalid), set any --header, and\n"
        "redrive that one message to its queue's inbound. The edit is recorded in the actions\n"
        "ledger and, with the original and new body and headers, in the queue's edits table\n"
        "(shown by inspect and history). Killed and run again with the same arguments (or --id), it\n"
        "completes without writing anything twice; run again after it completed, it changes nothing.",
        _edit,
    )
    sub.add_argument("message_id", metavar="MESSAGE_ID", help="the failed message's message_id")
    sub.add_argument("--body-file", metavar="FILE", required=True, help="the new body, as raw bytes")
    sub.add_argument("--header", metavar="K=V", type=_header, action="append",
                     help="set a header (repeatable); the other headers are kept")
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only look in this queue")
    sub.add_argument("--from", dest="source", choices=FAILURE_TABLES, default=None,
                     help="only look in this table")
    sub.add_argument("--id", metavar="ID", help="the edit's id (resume or repeat it)")
    sub.add_argument("--actor", metavar="NAME", default=default_actor(), help="who (recorded)")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")

    sub = command(
        "history", "one timeline of everything that happened to a message",
        "Show the journey of MESSAGE_ID across every queue, oldest first: enqueued, each attempt\n"
        "(with its error and run id), each move between tables, dead-lettering, quarantine,\n"
        "redrives and edits (with their action ids), processing and purge. Reads the tables only;\n"
        "changes nothing.",
        _history,
    )
    sub.add_argument("message_id", metavar="MESSAGE_ID", help="the message's message_id")
    sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub = command(
        "enable", "re-enable a disabled queue (recorded with who, when and why)",
        "Re-enable QUEUE after it was disabled (a faulted message or an outage). The change is\n"
        "recorded in the queue's events table with the actor, the time and the reason. Running\n"
        "it on an enabled queue records nothing and succeeds.",
        _enable,
    )
    sub.add_argument("queue", metavar="QUEUE", help="the application queue to enable")
    sub.add_argument("--reason", metavar="TEXT", default="re-enabled from the command line",
                     help="why it is being enabled (recorded); default: %(default)r")
    sub.add_argument("--actor", metavar="NAME", default=default_actor(),
                     help="who is enabling it (recorded); default: your login name")

    sub = command(
        "redrive", "send failed messages back to an inbound queue (filters, dry run, rate, resumable)",
        "Send the messages selected in QUEUE's poison, dead_letter or quarantine table back to its\n"
        "inbound (or --to another queue's). Filters combine (all must hold). Messages keep their\n"
        "message_id; their abort and move counts restart and redrive_count goes up by one.\n"
        "Messages the target already processed, and messages redriven max_redrives times (unless\n"
        "--force), are left where they are and counted. A redrive has an id (--id, default derived\n"
        "from the arguments): killed and run again with the same id it completes without moving\n"
        "anything twice; run again after it completed, it moves nothing.",
        _redrive,
    )
    sub.add_argument("queue", metavar="QUEUE", help="the queue whose failed messages are redriven")
    sub.add_argument("--from", dest="source", required=True, choices=FAILURE_TABLES, help="where they are")
    sub.add_argument("--to", metavar="QUEUE", default=None, help="another declared queue's inbound")
    _add_selection_arguments(sub)
    sub.add_argument("--dry-run", action="store_true", help="say what would move; change nothing")
    sub.add_argument("--rate", metavar="N/s", type=_rate, help="release N messages a second (due times)")
    sub.add_argument("--limit", metavar="N", type=int, help="move at most N messages")
    sub.add_argument("--id", metavar="ID", help="the redrive's id (resume or repeat it)")
    sub.add_argument("--force", action="store_true", help="also messages past the loop guard (max_redrives)")
    sub.add_argument("--actor", metavar="NAME", default=default_actor(), help="who (recorded)")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")

    sub = command(
        "purge", "delete failed messages for good (older than an age; confirmation or --yes)",
        "Delete for good the messages of QUEUE's poison, dead_letter or quarantine table that failed\n"
        "more than AGE ago (--older-than, by the time they entered the table) and match the filters\n"
        "(all must hold). Without --yes it shows what it would delete (counts per failure group and\n"
        "message type, sample ids) and asks on the terminal; when stdin is not a terminal it refuses\n"
        "(exit 1) and deletes nothing. Each purged message keeps a row in the queue's purged ledger\n"
        "(id, where it was, when it failed, which action), counted by the conservation line; the\n"
        "action is recorded in the actions ledger. A purge killed midway is completed by the next\n"
        "purge of the queue (or by running it again with its --id); nothing is deleted twice.",
        _purge,
    )
    sub.add_argument("queue", metavar="QUEUE", help="the queue whose failed messages are purged")
    sub.add_argument("--table", required=True, choices=FAILURE_TABLES, help="where they are")
    sub.add_argument("--older-than", metavar="AGE", required=True, type=_age,
                     help="failed more than this long ago: 30d, 12h, 90m, PT1H or seconds")
    _add_selection_arguments(sub)
    sub.add_argument("--yes", "-y", action="store_true", help="delete without asking")
    sub.add_argument("--id", metavar="ID", help="the purge's id (resume it after a kill)")
    sub.add_argument("--actor", metavar="NAME", default=default_actor(), help="who (recorded)")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")

    sub = command(
        "undo", "reverse a redrive, an edit or a purge (itself recorded as an action)",
        "Undo ACTION_ID: when no other commit touched its tables since, restore each to the version it\n"
        "had before (Delta RESTORE); otherwise move back the messages still where it put them (from\n"
        "the table as it was before, by Delta time travel) and name those that moved on since. A purge\n"
        "comes back from Delta time travel (until a vacuum deletes those files) and leaves the purged\n"
        "ledger; an edit is undone through its redrive (the original body comes back).",
        _undo,
    )
    sub.add_argument("action_id", metavar="ACTION_ID", help="an action id from `actions`")
    sub.add_argument("--actor", metavar="NAME", default=default_actor(), help="who (recorded)")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")

    sub = command(
        "actions", "list the operator actions recorded per queue (who, when, what, state)",
        "List every operator action recorded in the queues' actions ledgers, oldest first: its id,\n"
        "kind (enable, end_conversation, ...), actor, time, state (planned, done, undone), counts\n"
        "and arguments. An action left `planned` was interrupted: run it again with its id.",
        _actions,
    )
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue")
    sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub = command(
        "end-conversation", "end a conversation with an error: its messages leave every queue",
        "End conversation ID with an error (Service Broker's END CONVERSATION WITH ERROR):\n"
        "- the end is recorded in the queue's conversations table (code, description, who, when)\n"
        "  and as a conversation_ended event;\n"
        "- every message of it waiting in inbound, a retry subqueue or poison is moved to\n"
        "  dead_letter with reason conversation_ended and the table it came from;\n"
        "- each sender of those messages gets one conversation_error notification carrying the\n"
        "  code and description;\n"
        "- the queue's on_conversation_end hook runs once, so the application can drop the state\n"
        "  it kept for the conversation.\n"
        "Without --queue, every queue where the conversation has messages, ledger rows or a\n"
        "recorded end. Safe to run twice: a conversation already ended is not recorded again\n"
        "(the first code and description stand), messages that arrived since are moved, and\n"
        "unfinished steps (after a crash, or a failed hook) are completed.",
        _end_conversation,
    )
    sub.add_argument("conversation_id", metavar="ID", help="the conversation_id of the messages")
    sub.add_argument("--code", type=int, required=True, metavar="N",
                     help="error code, non-zero: positive for an application error, negative for a "
                          "system error (e.g. -8489 lifetime expired)")
    sub.add_argument("--description", required=True, metavar="TEXT",
                     help="what went wrong, sent to the senders (non-empty, at most 3000 characters)")
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None,
                     help="only this queue, even where the conversation has no messages (default: every "
                          "queue where it has messages, ledger rows or a recorded end)")
    sub.add_argument("--actor", metavar="NAME", default=default_actor(),
                     help="who is ending it (recorded); default: your login name")
    sub.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


# What each refusal the commands raise exits with; the message itself names what was wrong.
_EXIT_FOR: tuple[tuple[type[Exception], int], ...] = (
    (UsageError, EXIT_USAGE), (DeclarationError, EXIT_USAGE), (LeaseHeld, EXIT_BUSY),
    (StateNotRecorded, EXIT_INCOMPLETE),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse exits after --help (0) and on usage errors (2)
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    # The lease says on stderr whom a command waits for (storage/lease.py logs it).
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(message)s", stream=sys.stderr)
    try:
        code: int = args.run(args)
        return code
    except (UsageError, DeclarationError, LeaseHeld, StateNotRecorded) as error:
        print(f"{PROG} {args.command}: error: {error}", file=sys.stderr)
        return next(code for kind, code in _EXIT_FOR if isinstance(error, kind))
    except BrokenPipeError:
        # The reader went away (`| head`): nothing is wrong, and nothing more can be printed.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INCOMPLETE
    except (DeltaError, OSError) as error:
        # The lake itself failed (unreachable store, permissions, a damaged log): say which.
        print(f"{PROG} {args.command}: error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_INCOMPLETE


def console_main() -> NoReturn:
    """The `poison-pipeline` command: `main`, then end the process before Python finalizes.

    Tables are read through delta-rs's `to_pyarrow_dataset`, whose files are Python objects (a
    `pyarrow.fs.PyFileSystem` over delta-rs's handler, and the buffers its files return). Arrow
    drops the last references to them on its own worker threads, sometimes just after the read has
    returned, and such a thread then needs the GIL. Once Python 3.11 has begun finalizing, a thread
    asking for the GIL is ended with pthread_exit, which unwinds through Arrow's noexcept destructor:
    std::terminate, "terminate called without an active exception" and exit code 134 after the
    answer was printed (delta-rs#2184, apache/arrow#33975). Dropping our own datasets earlier does
    not help: the last reference is Arrow's. So the command does what an exit does before
    finalizing (wait for non-daemon threads, run the atexit handlers, flush stdout and stderr) and
    then leaves with os._exit, which never finalizes.
    """
    try:
        code = main()
    except Exception:  # a bug: Python's own traceback and exit code, but still no finalizing
        sys.excepthook(*sys.exc_info())
        code = EXIT_INCOMPLETE
    os._exit(_shut_down(code))


def _shut_down(code: int) -> int:
    """What an interpreter exit does before finalizing, in its order; returns the exit code to use."""
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads, as Py_FinalizeEx does
    atexit._run_exitfuncs()  # logging.shutdown among them
    return flush_output(code)


def flush_output(code: int) -> int:
    """Flush stdout and stderr; an output that could not be written makes a success exit code 1."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`| head`), as in main
        code = code or EXIT_INCOMPLETE
    except OSError as error:
        code = code or EXIT_INCOMPLETE
        with contextlib.suppress(OSError):
            print(f"{PROG}: error: could not write the output: {error}", file=sys.stderr)
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    console_main()
