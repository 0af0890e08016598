"""The demo's application: inventory withdrawals and purchase orders (see the reference documents)."""
