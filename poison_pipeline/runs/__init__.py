"""Dagster run workers: a run launcher that hands each run to a warm, pre-imported process."""
