"""The `poison-pipeline` command line for operators (SPEC section 8): one module per command, each
parsing its arguments and printing what an operation of `poison_pipeline.operations` returns; this
module assembles them and turns refusals into exit codes.

Exit codes: 0 success; 1 the command ran but not everything went through (lines refused, message not
found, storage failure); 2 usage or configuration errors; 3 the queue is busy (another run held its
lease for longer than `lease.wait`, or took it over while this command ran: LeaseLost). A user
mistake is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from deltalake.exceptions import DeltaError

from poison_pipeline.cli import (
    actions,
    archive,
    check,
    edit,
    enable,
    end_conversation,
    enqueue,
    groups,
    history,
    inspect_message,
    maintain,
    purge,
    redrive,
    simulate,
    status,
    undo,
)
from poison_pipeline.cli.common import (
    CONFIG_HELP,
    EXIT_BUSY,
    EXIT_CODES,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    UsageError,
    check_text_arguments,
)
from poison_pipeline.domain.declaration import DeclarationError
from poison_pipeline.domain.redaction import redact
from poison_pipeline.storage.control import StateNotRecorded
from poison_pipeline.storage.faults import shown
from poison_pipeline.storage.lease import LeaseHeld, LeaseLost

__all__ = ["EXIT_BUSY", "EXIT_INCOMPLETE", "EXIT_OK", "EXIT_USAGE", "build_parser", "console_main",
           "flush_output", "main", "run_console"]

# In the order `--help` lists them.
_COMMANDS = (enqueue, status, groups, inspect_message, edit, history, enable, redrive, purge, archive, undo, actions,
             end_conversation, maintain, simulate, check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate poison_pipeline queues: enqueue messages, see their status, group the "
                    "failures, inspect a message, end a conversation with an error, re-enable a "
                    "disabled queue.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", default=None, help=CONFIG_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in _COMMANDS:
        command.add_parser(commands)
    return parser


# What each refusal the commands raise exits with; the message itself names what was wrong.
_EXIT_FOR: tuple[tuple[type[Exception], int], ...] = (
    (UsageError, EXIT_USAGE), (DeclarationError, EXIT_USAGE), (LeaseHeld, EXIT_BUSY),
    # Another run has the queue now, as with LeaseHeld: this one stopped before committing more.
    (LeaseLost, EXIT_BUSY), (StateNotRecorded, EXIT_INCOMPLETE),
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
        check_text_arguments(args)
        code: int = args.run(args)
        return code
    except (UsageError, DeclarationError, LeaseHeld, LeaseLost, StateNotRecorded) as error:
        _error(args.command, str(error))
        return next(code for kind, code in _EXIT_FOR if isinstance(error, kind))
    except BrokenPipeError:
        # The reader went away (`| head`): nothing is wrong, and nothing more can be printed.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INCOMPLETE
    except (DeltaError, OSError) as error:
        # The lake itself failed (unreachable store, permissions, a damaged log, a failed write): say which.
        _error(args.command, shown(error))
        return EXIT_INCOMPLETE


def _error(command: str, said: str) -> None:
    """A refusal's one line on stderr; what the store said may carry a URL with credentials."""
    print(f"{PROG} {command}: error: {redact(said)}", file=sys.stderr)


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
    os._exit(shut_down(run_console()))


def run_console(argv: Sequence[str] | None = None) -> int:
    """What `console_main` runs before ending the process: `main`, with a bug (an exception no
    refusal accounts for) shown as Python shows it and exit code 1. Tests call it in-process."""
    try:
        return main(argv)
    except Exception:  # a bug: Python's own traceback and exit code, but still no finalizing
        sys.excepthook(*sys.exc_info())
        return EXIT_INCOMPLETE


def shut_down(code: int) -> int:
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

