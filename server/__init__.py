"""The server: the processes, APIs and paths around the catalog and its lifecycle.

Subpackages by role, lowest first (each may import the ones before it, `catalog`
and `lifecycle`, never one after it):
`errors.py` and `metrics.py` (shared by all of them), `write_buffer/` (Kafka),
`runtime/` (Spark, the embedded broker, process tuning), `pool/identity.py` (an ingester
pool's Kafka cluster and object store), `config.py`,
`consume/` (micro-batches into the catalog, recovery), `write/` (line protocol,
router, deletes), `query/` (SQL, the write buffer's tail), `api/` (gRPC, HTTP,
the client), the admin operations the app composes (`retention_admin.py`, `freeze_admin.py`, `pool/` (the ingester pool),
`verify_admin.py`),
`startup.py` (the steps of the start), `app.py` (the composition root) and `cli/` (the `iox` command).
tests/unit/test_import_layers.py checks it.

May import: `catalog`, `chunk_store`, `lifecycle`, the generated stubs `iox`, third-party libraries.
"""
