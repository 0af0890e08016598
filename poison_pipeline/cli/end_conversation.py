"""`end-conversation ID --code N --description TEXT [--queue Q]`: end a conversation with an error."""

from __future__ import annotations

import argparse
from dataclasses import asdict

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
from poison_pipeline.cli.requests import add_field, request_of
from poison_pipeline.domain.conversation_errors import ConversationError
from poison_pipeline.domain.durations import when
from poison_pipeline.operations.end_conversation import EndConversationRequest, end_conversation
from poison_pipeline.operations.requests import ActionContext


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
    add_field(sub, EndConversationRequest, "conversation_id", metavar="ID")
    add_field(sub, EndConversationRequest, "code", "--code", required=True, metavar="N")
    add_field(sub, EndConversationRequest, "description", "--description", required=True, metavar="TEXT")
    add_field(sub, EndConversationRequest, "queue", "--queue", "-q", metavar="QUEUE")
    add_actor(sub, "who is ending it (recorded); default: your login name")
    add_json(sub)


def run(args: argparse.Namespace) -> int:
    request = request_of(EndConversationRequest, args)
    declaration = declaration_of(args, import_code=True)  # it runs the clean-up hook
    try:
        results = [end.result for end in end_conversation(declaration, request, ActionContext(actor=args.actor))]
    except ConversationError as error:
        raise UsageError(str(error)) from None
    if not results:
        complain(args, f"conversation {args.conversation_id!r} has no messages, ledger rows or recorded end in "
                       f"queues {', '.join(declaration.queues)}; name a queue with --queue to end it there anyway")
        return EXIT_INCOMPLETE
    if args.json:
        print_json([{**asdict(r), "kind": r.kind, "removed_total": r.removed_total} for r in results])
    else:
        print("\n".join(_text(r, request.code, request.description) for r in results))
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
