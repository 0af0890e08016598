"""`check`: validate the declaration as running its queues needs it, every handler imported."""

from __future__ import annotations

import argparse
import sys

from poison_pipeline.cli.common import EXIT_OK, EXIT_USAGE, Commands, add_command
from poison_pipeline.views.declaration_check import check_declaration


def add_parser(commands: Commands) -> None:
    add_command(
        commands, "check", "validate the declaration and import every handler, hook and exception type it names",
        "Validate the declaration as the queues' runs need it: every field, then every handler,\n"
        "clean-up hook, alert hook and exception type imported in this Python environment. Each\n"
        "problem is one line on stderr, FILE:LINE: field: what is wrong. A queue whose code\n"
        "cannot be imported does not stop the others under Dagster: its sensors skip, saying\n"
        "why; this command says it before the code location loads. Exit 2 on any problem.",
        run,
    )


def run(args: argparse.Namespace) -> int:
    checked = check_declaration(args.config)
    for problem in checked.problems:
        print(problem, file=sys.stderr)
    if not checked.passed:
        print(f"{checked.path}: {len(checked.problems)} problem(s)", file=sys.stderr)
        return EXIT_USAGE
    queues = checked.declaration.queues if checked.declaration is not None else {}
    print(f"{checked.path}: valid; {len(queues)} queue(s), every handler, hook and exception type imports")
    return EXIT_OK
