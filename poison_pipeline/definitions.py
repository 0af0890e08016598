"""Entry point for `dagster dev`: the definitions of the declared queues (see poison_pipeline.yaml),
built by the same component a `dg` project declares in its `defs.yaml`. Its user code is imported
queue by queue, so one queue's broken handler stops that queue only."""

from poison_pipeline.defs.component import PoisonQueuesComponent
from poison_pipeline.domain.declaration import load_declaration

defs = PoisonQueuesComponent(load_declaration(import_code=False)).definitions()
