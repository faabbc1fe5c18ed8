"""The consume path: write-buffer micro-batches into the in-memory catalog.

The Spark streaming query (`consumer.py`), the micro-batch apply with its
transactions and deletes (`ingest.py`), recovery at start from the preserved
catalog (`recovery.py`), the column types replay will bring
(`replay_schemas.py`) and the watermarks per Kafka partition (`watermarks.py`).

May import: `catalog`, `chunk_store`, `lifecycle`, `server.errors`, `server.metrics`,
`server.write_buffer`, `server.runtime`, `server.config`.
"""
