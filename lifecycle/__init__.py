"""The lifecycle: what becomes of a chunk after ingest, decided by a pure policy.

Chunk forms and how Spark reads them (`chunk_data.py`, `ipc_segments.py`,
`local_rows.py`, `views.py`, `parquet_source.py`), where materialised chunk data
lives (`chunk_checkpoint.py`), what the application runs on and its parallelism
(`cluster.py`), the policies (`policy.py`,
`rules.py`, and retention's `prune_policy.py`: state in, actions out) and the actions the worker executes
(`compact.py`, `compact_persisted.py`, `persist.py`, `unload.py`, `worker.py`).

May import: `catalog` and third-party libraries; never `server`.
"""
