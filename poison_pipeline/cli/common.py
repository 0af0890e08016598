"""What the commands share: exit codes, refusals, the declaration, error lines on stderr, `--json`
output, and the arguments several commands take (`--config` after the command, `--json`, `--actor`)."""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeAlias

from poison_pipeline.domain.declaration import CONFIG_ENV, Declaration, DeclarationError, load_declaration
from poison_pipeline.domain.durations import parse_moment, parse_time
from poison_pipeline.operations.actions import default_actor
from poison_pipeline.views.declaration_check import located_error
from poison_pipeline.views.user_code import CodeProblem, code_problem

PROG = "poison-pipeline"
EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3

EXIT_CODES = """exit codes:
  0  success
  1  the command ran but not everything went through (refused lines, message or
     conversation not found, a clean-up hook failed, storage failure; nothing selected
     to redrive or purge, or a purge not confirmed)
  2  usage or configuration error (unknown queue, missing file, invalid declaration,
     invalid error code or description; for check, code that cannot be imported)
  3  the queue is busy: another run held its lease for longer than lease.wait
     (the error names it: run id, host, pid, since when), or this command lost the
     lease to another run midway and stopped before committing more (run it again:
     an interrupted action is completed by its next run or the queue's next cycle)"""

CONFIG_HELP = f"declaration file (YAML); default: ${CONFIG_ENV} if set, else ./poison_pipeline.yaml"

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Run: TypeAlias = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A mistake in what the user asked for: one line on stderr, exit code 2."""


def add_command(commands: Commands, name: str, summary: str, description: str, run: Run) -> argparse.ArgumentParser:
    """A subcommand that runs `run(args)`, with the exit codes in its help."""
    # Also accepted after the command (`poison-pipeline status --config x.yaml`); SUPPRESS keeps
    # the subcommand from overwriting a --config given before it.
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP)
    sub = commands.add_parser(name, help=summary, description=description, epilog=EXIT_CODES,
                              parents=[config], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.set_defaults(run=run)
    return sub


def add_json(sub: argparse.ArgumentParser, instead_of: str = "text") -> None:
    sub.add_argument("--json", action="store_true", help=f"print JSON instead of {instead_of}")


def add_actor(sub: argparse.ArgumentParser, says: str = "who (recorded)") -> None:
    sub.add_argument("--actor", metavar="NAME", default=default_actor(), help=says)


def check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse an argument that is not UTF-8 text: the shell passes bytes, which Python turns into
    lone surrogates; no id, queue or path in the lake can be spelled so."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list | tuple) else [value]:
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as error:
                    byte = text[error.start].encode("utf-8", "surrogateescape")
                    raise UsageError(f"argument {name}: {text!r} is not UTF-8 text (byte {byte!r} at "
                                     f"character {error.start})") from None


def declaration_of(args: argparse.Namespace, *, import_code: bool = False) -> Declaration:
    """The declaration `--config` names. Operator commands run no handler: the application's
    modules are imported only when `import_code` (a command that calls a hook)."""
    try:
        return load_declaration(args.config, import_code=import_code)
    except DeclarationError as error:  # each error with its file and line, as `check` says them
        raise located_error(args.config, error) from None


def code_problems_of(declaration: Declaration, queues: list[str]) -> dict[str, CodeProblem]:
    """The queues among `queues` whose code does not import in this Python environment."""
    return {queue: problem for queue in queues if (problem := code_problem(declaration, queue))}


def code_warning(problem: CodeProblem) -> str:
    """What status and enqueue say of a queue whose code does not import."""
    return (f"queue {problem.queue!r}: its code does not import here, so its cycles cannot run (its messages "
            f"wait; `{PROG} check` gives the lines): {problem}")


def check_queue(declaration: Declaration, queue: str) -> None:
    if queue not in declaration.queues:
        raise UsageError(f"no queue {queue!r} is declared; declared: {', '.join(declaration.queues)}")


def complain(args: argparse.Namespace, text: str) -> None:
    """One line on stderr, after the command's name: why not everything went through."""
    print(f"{PROG} {args.command}: {text}", file=sys.stderr)


def _json_value(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def print_json(data: object) -> None:
    """The `--json` output: times ISO 8601, bytes base64."""
    print(json.dumps(data, default=_json_value, indent=2, ensure_ascii=False))


def moment(text: str) -> datetime:
    """An ISO 8601 time argument; UTC when it names no zone."""
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def moment_or_age(text: str) -> datetime:
    """A time argument given as an age before now (1h) or an ISO 8601 time."""
    try:
        return parse_moment(text, now=datetime.now(UTC))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
