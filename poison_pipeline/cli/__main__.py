"""`python -m poison_pipeline.cli`: the `poison-pipeline` command."""

from poison_pipeline.cli import console_main

console_main()
