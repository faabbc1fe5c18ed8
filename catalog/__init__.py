"""The catalog: the in-memory state of every database and its preserved form.

Databases, partitions, chunks, persistence windows and the delete mailbox
(`catalog.py`, `chunk.py`, `persistence_windows.py`, `delete_mailbox.py`), and the
lifecycle's claims and swaps of a partition's chunks (`partition_moves.py`);
checkpoints, transactions and the preserved catalog in the object store
(`checkpoint.py`, `transactions.py`, `preserved_catalog.py`, `object_store.py`,
`cleanup.py`), retention's watermarks (`retention.py`), the pins of running queries
(`query_pins.py`), and an ingester pool's ownership of Kafka partitions and agreed column
types (`ownership.py`, `pool_schema.py`). It is also the lowest package, so it holds the vocabulary every
layer shares: schemas (`schema.py`), the sequence layout (`seq_layout.py`),
where writes go in Kafka (`sharding.py`), partition keys (`partition_keys.py`),
the delete predicate language (`delete_predicate.py`) and the crash-point
registry (`crash_points.py`).

May import: the standard library, pyarrow and the other third-party libraries;
never `lifecycle` or `server`. No clock is read here: callers pass `now`.
"""
