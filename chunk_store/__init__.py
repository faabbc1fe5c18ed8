"""Chunk storage in Spark: the forms a chunk's rows take and how Spark reads them.

Chunk forms and their reads (`chunk_data.py`: materialised and merged chunk data;
`ipc_segments.py`: Arrow IPC segments held by executors; `local_rows.py`: rows held on the
driver; `parquet_source.py` and `parquet_cache.py`: persisted files and their local copies),
the views queries read (`views.py`, `chunk_views.py`), the Arrow merge of chunks
(`arrow_merge.py`: deduplication and deletes), where materialised chunk data lives
(`chunk_checkpoint.py`), and what the application runs on and its parallelism (`cluster.py`).
What a chunk becomes, and when, is the lifecycle's (lifecycle/).

May import: `catalog` and third-party libraries; never `lifecycle` or `server`.
"""
