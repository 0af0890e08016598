"""Delta tables of a queue, committed with delta-rs: schemas, paths, enqueueing, the cycle journal."""
