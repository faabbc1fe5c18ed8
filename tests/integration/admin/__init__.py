"""Operating a server: the iox commands, frozen mode, poisoned messages, retention and iox verify.

Real processes, as every integration test (tests/integration/__init__.py)."""
