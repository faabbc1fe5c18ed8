"""The write path: request bounds, backpressure, deletes, multi-message transactions and the write path's CPU priority.

Real processes, as every integration test (tests/integration/__init__.py)."""
