"""Queue semantics with no knowledge of Spark, Delta or Dagster."""
