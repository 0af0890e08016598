"""Read-only views: what a declaration's user code and a lake say, changing nothing."""
