"""The retry cycle as one Spark batch: selection, delivery on the executors, staged commits."""
