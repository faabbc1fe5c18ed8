"""The ingester pool (seed 001): several servers share a database's Kafka partitions, one owner
each, handed over by an assigner, with one preserved catalog that every member commits to.

Modules, lowest layer first: `identity.py` (the pool's Kafka cluster and object store, checked at
a member's start), `rows.py` (an owner's unpersisted rows as another member asks for them),
`assigner_policy.py` (which member gets which partition: pure), `assigner_lease.py` (one
assigner at a time), `assigner.py` (the assigner process), `assigner_status.py` (its status
endpoint) and `membership.py` (a member's claims, losses, and the other members' files and rows).
The ownership itself is the catalog's (catalog/ownership.py, catalog/partition_moves.py).

May import: `catalog`, `chunk_store`, `lifecycle` and the server's layers below each module
(tests/unit/test_import_layers.py).
"""
