"""The lifecycle: persistence to both object stores, the preserved catalog and one committer (fencing).

Real processes, as every integration test (tests/integration/__init__.py)."""
