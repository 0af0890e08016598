"""Entry point for `dagster dev`: the definitions of the declared queues (see poison_pipeline.yaml)."""

from poison_pipeline.defs.build import build_definitions
from poison_pipeline.domain.declaration import load_declaration

defs = build_definitions(load_declaration())
