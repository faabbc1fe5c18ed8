"""The consume path: write-buffer micro-batches into the in-memory catalog.

The Spark streaming query (`consumer.py`), the micro-batch apply with its
transactions and deletes (`ingest.py`), recovery at start from the preserved
catalog (`recovery.py`) and the column types replay will bring
(`replay_schemas.py`).

May import: `catalog`, `lifecycle`, `server.errors`, `server.metrics`,
`server.write_buffer`, `server.runtime`, `server.config`.
"""
