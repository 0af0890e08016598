"""`simulate --policy FILE [--since AGE] [--queue Q] [--json]`: what a candidate policy would have done."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime

from poison_pipeline.cli.common import EXIT_OK, Commands, add_command, add_json, check_queue, declaration_of, print_json
from poison_pipeline.domain.declaration import load_policy
from poison_pipeline.domain.durations import parse_duration
from poison_pipeline.operations.simulate import simulate
from poison_pipeline.text.simulation import format_simulation


def _age(text: str) -> object:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(commands: Commands) -> None:
    sub = add_command(
        commands, "simulate", "what a candidate policy would have done with the recorded attempts",
        "Replay the attempts a queue recorded under the policy in FILE (the policy's fields, as in\n"
        "a queue's `policy:` section) and report, per message type and failure group, how many\n"
        "messages it would have processed, dropped, poisoned, dead-lettered, quarantined or left\n"
        "faulted or waiting, after how many attempts and how long, beside what was recorded.\n"
        "What the record cannot say is filled by assumptions, which the report lists. Reads the\n"
        "ledgers with delta-rs (no Spark); changes nothing.",
        run,
    )
    sub.add_argument("--policy", metavar="FILE", required=True, help="the candidate policy (YAML or JSON)")
    sub.add_argument("--since", metavar="AGE", type=_age, default=None,
                     help="only journeys whose first attempt is this recent (90, 30m, 7d; default: all)")
    sub.add_argument("--queue", "-q", metavar="QUEUE", default=None, help="only this queue (default: all)")
    add_json(sub, "a table")


def run(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    declaration = declaration_of(args)
    if args.queue is not None:
        check_queue(declaration, args.queue)
    since = None if args.since is None else datetime.now(UTC) - args.since
    found = [simulate(declaration, queue, policy, since=since) for queue in ([args.queue] if args.queue
                                                                             else declaration.queues)]
    if args.json:
        print_json([asdict(f) for f in found] if args.queue is None else asdict(found[0]))
    else:
        print("\n\n".join(format_simulation(f) for f in found))
    return EXIT_OK
