"""The declared queues as a Dagster component: `type: poison_pipeline.PoisonQueuesComponent` in a
`dg` project's `defs.yaml`, whose `attributes` are the declaration (`poison_pipeline.yaml`'s fields).

The declaration's own pydantic model is the component's model, so `dg check yaml` checks the
attributes against its JSON schema (fields, types, values) and loading them gives the same errors,
rules included, as the command line. The code the queues name is not imported to load: a queue whose
handler does not import is contained (defs/build.py), and `poison-pipeline check` names it.
Templates (`{{ env.LAKE_ROOT }}`) are rendered before the declaration is read; a relative `lake_root`
is the project's folder's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from dagster.components.core.decl import YamlBackedComponentDecl
from dagster.components.scaffold.scaffold import Scaffolder, ScaffoldRequest, scaffold_with
from pydantic import BaseModel

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import Declaration, DeclarationError, parse_declaration

__all__ = ["PoisonQueuesComponent"]

# What `dg scaffold defs poison_pipeline.PoisonQueuesComponent NAME` writes: a queue that loads as
# it is (the example order handler), to replace with the application's own.
SCAFFOLD = """\
type: poison_pipeline.PoisonQueuesComponent

attributes:
  lake_root: lake                     # relative to the project's folder; s3://, az://, gs:// too
  queues:
    orders:
      handler: poison_pipeline.examples.handlers:place_order   # package.module:function
      policy:
        receive_retry_count: 1
        max_retry_cycles: 2
        retry_cycle_delay: 30m
"""


class PoisonQueuesScaffolder(Scaffolder[BaseModel]):
    def scaffold(self, request: ScaffoldRequest[BaseModel]) -> None:
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(SCAFFOLD)


@scaffold_with(PoisonQueuesScaffolder)
class PoisonQueuesComponent(dg.Component):
    """Poison-message handling for declared queues: their tables as assets, retry cycles launched by
    sensors, checks, alerts and the operator jobs."""

    def __init__(self, declaration: Declaration) -> None:
        self.declaration = declaration

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return Declaration

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> PoisonQueuesComponent:
        raw = _written_attributes(context)
        if raw is None:  # built from a dict in Python (from_attributes_dict): the model is all there is
            raw = attributes.model_dump(mode="json", exclude_unset=True) if attributes is not None else {}
        return cls(parse_declaration(raw, f"{context.path} (attributes)", Path(context.project_root),
                                      import_code=False))

    def definitions(self) -> dg.Definitions:
        """The queues' Dagster definitions, without a component tree (`definitions.py` uses this)."""
        return build_definitions(self.declaration)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return self.definitions()


def _written_attributes(context: dg.ComponentLoadContext) -> dict[str, Any] | None:
    """The attributes as the YAML wrote them, templates rendered; None when not from YAML."""
    decl = getattr(context, "component_decl", None)
    if not isinstance(decl, YamlBackedComponentDecl) or decl.component_file_model is None:
        return None
    written = decl.component_file_model.attributes or {}
    unset = list(_unset_variables(written, "attributes"))
    if unset:  # rendered, each would read as null: say which variable it needs instead
        raise DeclarationError(f"invalid declaration {context.path}:\n" + "\n".join(
            f"  {path} = {text!r}: the environment variable {name} is not set" for path, text, name in unset))
    rendered = context.resolution_context.resolve_value(written)
    return rendered if isinstance(rendered, dict) else None


_ENV_TEMPLATE = re.compile(r"\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _unset_variables(value: object, path: str) -> Iterator[tuple[str, str, str]]:
    """(where, the text, the variable) for each `{{ env.NAME }}` of an unset variable in `value`."""
    if isinstance(value, str):
        for name in _ENV_TEMPLATE.findall(value):
            if name not in os.environ:
                yield path, value, name
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _unset_variables(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unset_variables(item, f"{path}[{index}]")
