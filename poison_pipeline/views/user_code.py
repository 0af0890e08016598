"""Whether the code a declared queue names can be imported: its handler, its hooks, the exception
types of its policy. A queue whose code cannot be imported is kept out of the way of the others
(its sensors skip, saying why); the others run as declared.

A declaration is read without importing (`parse_declaration(..., import_code=False)`), then each
queue is validated again with its imports, alone: the same validators, so the same rules and the
same words as a declaration loaded whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from poison_pipeline.domain.declaration import Declaration, QueueDeclaration, field_path
from poison_pipeline.domain.imports import IMPORT_CODE, import_callable

__all__ = ["CodeProblem", "code_problem", "code_problems", "declaration_code_problem"]


@dataclass(frozen=True)
class CodeProblem:
    """Why the code a queue names cannot be imported: one line per field that failed."""

    queue: str
    lines: tuple[str, ...]

    def __str__(self) -> str:
        return "; ".join(self.lines)


def code_problem(declaration: Declaration, queue: str) -> CodeProblem | None:
    """What stops `queue`'s code from importing, or None when all of it imports."""
    declared = declaration.queue(queue)
    try:
        QueueDeclaration.model_validate(declared.model_dump(), context={IMPORT_CODE: True})
    except ValidationError as error:
        return CodeProblem(queue, tuple(
            f"{field_path(('queues', queue, *item['loc']))}: {_one_line(item['msg'])}" for item in error.errors()))
    except Exception as error:  # noqa: BLE001 - a module's import-time code may raise anything (SyntaxError too)
        return CodeProblem(queue, (f"{field_path(('queues', queue))}: importing its code raised "
                                   f"{type(error).__name__}: {_one_line(str(error))}",))
    return None


def code_problems(declaration: Declaration) -> dict[str, CodeProblem]:
    """The queues whose code cannot be imported, by queue, in the declaration's order."""
    return {queue: problem for queue in declaration.queues if (problem := code_problem(declaration, queue))}


def declaration_code_problem(declaration: Declaration) -> str | None:
    """What stops the declaration's own `alert_hook` from importing, or None."""
    if declaration.alert_hook is None:
        return None
    try:
        import_callable(declaration.alert_hook)
    except Exception as error:  # noqa: BLE001 - as code_problem's
        return f"alert_hook: {_one_line(str(error).removeprefix('Value error, '))}"
    return None


def _one_line(message: str) -> str:
    return " ".join(message.removeprefix("Value error, ").splitlines())
