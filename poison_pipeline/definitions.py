"""Entry point for `dagster dev`: the definitions of the declared queues (see poison_pipeline.yaml),
built by the same component a `dg` project declares in its `defs.yaml`."""

from poison_pipeline.defs.component import PoisonQueuesComponent
from poison_pipeline.domain.declaration import load_declaration

defs = PoisonQueuesComponent(load_declaration()).definitions()
