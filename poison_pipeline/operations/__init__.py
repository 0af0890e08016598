"""Operator actions (SPEC section 8): read-only views of the queues and the commands that change them.

Nothing here starts Spark: every view reads the Delta log, or a few narrow columns, with delta-rs.
"""
