"""The write buffer: the embedded broker, its outages, the streaming source's reads, foreign messages and the tail.

Real processes, as every integration test (tests/integration/__init__.py)."""
