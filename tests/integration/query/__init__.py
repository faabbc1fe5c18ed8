"""The query path: streaming results, the SQL sandbox, Spark Connect, the Spark data source and watermarks.

Real processes, as every integration test (tests/integration/__init__.py)."""
