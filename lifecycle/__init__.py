"""The lifecycle: what becomes of a chunk after ingest, decided by a pure policy.

The policies (`policy.py`, `rules.py`, and retention's `prune_policy.py`: state in, actions
out) and the actions the worker executes (`compact.py`, `compact_persisted.py`, `persist.py`,
`unload.py`, `worker.py`, which reaches the rest of the server only through `hooks.py`). How chunks are stored and read in Spark is `chunk_store`'s.
What is persisted is published as Apache Iceberg by its own task (`iceberg_publication.py`; which
files a table's Iceberg table references: `iceberg_plan.py`, pure; which files may share a key,
so need a merge: `iceberg_keys.py`).

May import: `catalog`, `chunk_store` and third-party libraries; never `server`.
"""
