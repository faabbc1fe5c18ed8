"""The consume path: micro-batches into the catalog, local chunks, and the checks a restart makes.

Real processes, as every integration test (tests/integration/__init__.py)."""
