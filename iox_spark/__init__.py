"""iox-spark: a write-buffered time-series ingest server on Kafka and Spark, in the style of InfluxDB IOx.

The one root package the project installs, so that nothing generic lands at the top of a user's
site-packages. Its subpackages live in the repository's top-level folders (setup.py maps them):
`iox_spark.catalog` (catalog/), `iox_spark.chunk_store` (chunk_store/), `iox_spark.lifecycle`
(lifecycle/), `iox_spark.server` (server/); `iox_spark.source` (iox_spark/source/) is the Spark data
source for users' own Spark sessions, and `iox_spark.iox` the gRPC stubs generated from proto/.

May import: nothing (each subpackage's `__init__.py` states its own rule).
"""
