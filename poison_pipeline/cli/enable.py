"""`enable QUEUE [--reason TEXT] [--actor NAME]`: resume a disabled queue, recorded with who and why."""

from __future__ import annotations

import argparse

from poison_pipeline.cli.common import EXIT_OK, Commands, add_actor, add_command, check_queue, declaration_of
from poison_pipeline.cli.requests import add_field, request_of
from poison_pipeline.domain.durations import when
from poison_pipeline.operations.enable import EnableRequest, enable
from poison_pipeline.operations.requests import ActionContext


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "enable", "re-enable a disabled queue (recorded with who, when and why)",
        "Re-enable QUEUE after it was disabled (a faulted message or an outage). The change is\n"
        "recorded in the queue's events table with the actor, the time and the reason. Running\n"
        "it on an enabled queue records nothing and succeeds.",
        run,
    )
    add_field(sub, EnableRequest, "queue", metavar="QUEUE")
    add_field(sub, EnableRequest, "reason", "--reason", metavar="TEXT")
    add_actor(sub, "who is enabling it (recorded); default: your login name")


def run(args: argparse.Namespace) -> int:
    request = request_of(EnableRequest, args)
    declaration = declaration_of(args)
    check_queue(declaration, request.queue)
    result = enable(declaration, request, ActionContext(actor=args.actor))
    if not result.changed:
        print(f"queue {args.queue!r} is already enabled; its state is unchanged (action {result.action.action_id})")
        return EXIT_OK
    before = result.before
    print(f"queue {args.queue!r} enabled by {args.actor}: {request.reason} (action {result.action.action_id})")
    print(f"  it was disabled since {when(before.since)} by {before.actor}: {before.reason}")
    return EXIT_OK
