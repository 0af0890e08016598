"""Dagster wiring generated from the declaration: assets, jobs, sensors, resources."""
