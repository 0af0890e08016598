"""`enable QUEUE [--reason TEXT] [--actor NAME]`: resume a disabled queue, recorded with who and why."""

from __future__ import annotations

import argparse

from poison_pipeline.cli.common import EXIT_OK, Commands, add_actor, add_command, check_queue, declaration_of
from poison_pipeline.operations.enable import enable
from poison_pipeline.operations.render import when


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "enable", "re-enable a disabled queue (recorded with who, when and why)",
        "Re-enable QUEUE after it was disabled (a faulted message or an outage). The change is\n"
        "recorded in the queue's events table with the actor, the time and the reason. Running\n"
        "it on an enabled queue records nothing and succeeds.",
        run,
    )
    sub.add_argument("queue", metavar="QUEUE", help="the application queue to enable")
    sub.add_argument("--reason", metavar="TEXT", default="re-enabled from the command line",
                     help="why it is being enabled (recorded); default: %(default)r")
    add_actor(sub, "who is enabling it (recorded); default: your login name")


def run(args: argparse.Namespace) -> int:
    declaration = declaration_of(args)
    check_queue(declaration, args.queue)
    result = enable(declaration, args.queue, args.actor, args.reason)
    if not result.changed:
        print(f"queue {args.queue!r} is already enabled; its state is unchanged (action {result.action.action_id})")
        return EXIT_OK
    before = result.before
    print(f"queue {args.queue!r} enabled by {args.actor}: {args.reason} (action {result.action.action_id})")
    print(f"  it was disabled since {when(before.since)} by {before.actor}: {before.reason}")
    return EXIT_OK
