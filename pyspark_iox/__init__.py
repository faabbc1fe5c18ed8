"""Spark's automatic registration of the `iox` data source (iox_spark/source/).

Spark 4 registers, in every session, the `DefaultSource` of each installed top-level
module whose name starts with `pyspark_`; with the project installed,
`spark.read.format("iox")` then works without `spark.dataSource.register`.

May import: `iox_spark.source` only (and through it what that package may import);
never `server`.
"""
from iox_spark.source import IoxDataSource as DefaultSource

__all__ = ["DefaultSource"]
