"""The processes: a Spark standalone cluster, Spark's home, its Python workers, the JVM archive.

Real processes, as every integration test (tests/integration/__init__.py)."""
