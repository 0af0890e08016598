"""Private Dagster names the rest of the product needs for its type hints only: every `dagster._*`
import lives in this package, where `test_layers.py` finds them all and checks they still resolve,
so a Dagster upgrade that moves one fails there, not in a user's run."""

from __future__ import annotations

from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

__all__ = ["UnresolvedAssetJobDefinition"]
