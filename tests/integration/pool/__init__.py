"""The ingester pool: members, claims and handoffs, its identity, and what a query pushes to an owner.

Real processes, as every integration test (tests/integration/__init__.py)."""
