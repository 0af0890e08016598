"""`end-conversation ID --code N --description TEXT [--queue Q]`: end a conversation with an error."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime

from poison_pipeline.broker.conversations import CONVERSATION_ENDED, EndResult
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
from poison_pipeline.domain.conversation_errors import ConversationError
from poison_pipeline.operations.end_conversation import end_conversation_by_operator, queues_to_end
from poison_pipeline.operations.render import when


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "end-conversation", "end a conversation with an error: its messages leave every queue",
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
        run,
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
    add_actor(sub, "who is ending it (recorded); default: your login name")
    add_json(sub)


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args, import_code=True)  # it runs the clean-up hook
    try:
        queues = queues_to_end(declaration, args.conversation_id, args.code, args.description, args.actor,
                               args.queue)
    except ConversationError as error:
        raise UsageError(str(error)) from None
    if not queues:
        complain(args, f"conversation {args.conversation_id!r} has no messages, ledger rows or recorded end in "
                       f"queues {', '.join(declaration.queues)}; name a queue with --queue to end it there anyway")
        return EXIT_INCOMPLETE
    now = datetime.now(UTC)
    results = [end_conversation_by_operator(declaration, queue, args.conversation_id, args.code,
                                            args.description, args.actor, now).result for queue in queues]
    if args.json:
        print_json([{**asdict(r), "kind": r.kind, "removed_total": r.removed_total} for r in results])
    else:
        print("\n".join(_text(r, args.code, args.description) for r in results))
    failed = [r for r in results if r.hook_error is not None]
    for result in failed:
        complain(args, f"error: queue {result.queue!r}: clean-up hook {result.hook} failed: {result.hook_error}; "
                       "the conversation is ended, run the command again to retry the hook")
    return EXIT_INCOMPLETE if failed else EXIT_OK


def _text(result: EndResult, code: int, description: str) -> str:
    what = f"with code {result.code} ({result.kind}): {result.description}"
    if result.already_ended:
        head = (f"conversation {result.conversation_id!r} in queue {result.queue!r}: already ended at "
                f"{when(result.ended_at)} by {result.actor} {what}; not recorded again")
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
