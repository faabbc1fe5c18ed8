"""Visibility: how far each Kafka partition of a database is visible, applied and persisted.

Invariant: visible >= applied >= persisted, per partition, and each only grows within a
write-buffer epoch: `visible` is the applied watermark raised by the write buffer's tail
(server/query/tail.py; applied alone without a tail); persisted is the preserved catalog's database
checkpoint of the current epoch (server/consume/watermarks.py). What the read barrier counts as
visible adds, in an ingester pool, every partition another member owns: its owner waits for a
token's offsets when asked for its rows (server/pool/rows.py).

Who calls it: the read barrier, the pool's answers, status and /metrics, from their threads
(driver); it reads copies of the catalog's offsets and asks Kafka only for `watermarks`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from iox_spark.server.consume.watermarks import partition_watermarks, persisted_hi_inclusive

if TYPE_CHECKING:
    from typing import Callable

    from iox_spark.catalog.catalog import Catalog, Database
    from iox_spark.catalog.preserved_catalog import RecordDatabaseCheckpoint
    from iox_spark.server.consume.watermarks import MessageSizes
    from iox_spark.server.query.tail import WriteBufferTail
    from iox_spark.server.write_buffer.kafka_ends import KafkaEnds

__all__ = ["Visibility", "OWNER_WAITS"]

#: the read barrier's visible offset of a partition another pool member owns: its owner waits
OWNER_WAITS = 1 << 62


class Visibility:
    """`catalog`: the in-memory catalog; `tail`: the WriteBufferTail, None without one; `kafka_ends`:
    server/write_buffer/kafka_ends.py; `message_sizes`: MessageSizes (lag in bytes);
    `database_checkpoint(name)`: the preserved catalog's database checkpoint of a database, None
    before its first one."""

    def __init__(self, catalog: Catalog, tail: WriteBufferTail | None, kafka_ends: KafkaEnds,
                 message_sizes: MessageSizes,
                 database_checkpoint: Callable[[str], RecordDatabaseCheckpoint | None]):
        self._catalog = catalog
        self._tail = tail
        self._kafka_ends = kafka_ends
        self._message_sizes = message_sizes
        self._database_checkpoint = database_checkpoint

    def visible(self, db: Database) -> dict:
        """{kp: visible_hi_inclusive} of `db` now (applied, plus the write buffer's tail)."""
        if self._tail is not None:
            return self._tail.visible(db)
        return db.applied_offsets()

    def for_barrier(self, db: Database) -> dict:
        """What the read barrier counts as visible: `visible`, and in an ingester pool every partition
        another member owns."""
        vis = self.visible(db)
        if db.owned_partitions is not None:
            owned = db.owned()
            vis = {**vis, **{kp: OWNER_WAITS for kp in range(db.kafka_partitions) if kp not in owned}}
        return vis

    def watermarks(self, db: Database) -> list:
        """The PartitionWatermarks of `db` (server/consume/watermarks.py); Kafka's ends are read through
        `KafkaEnds` (unknown when Kafka cannot be asked)."""
        ends = self._kafka_ends.ends(db)
        visible = self.visible(db)
        dbck = self._database_checkpoint(db.name)
        applied, epoch, topic = db.applied_in_epoch()  # offsets and their epoch at one instant
        persisted = persisted_hi_inclusive(dbck, epoch, applied)
        return partition_watermarks(applied, visible, persisted, ends,
                                    lambda kp: self._message_sizes.mean_bytes(topic, kp))

    def all_watermarks(self) -> list:
        """[(database, PartitionWatermarks)] of every database (/metrics, at each scrape)."""
        return [(db.name, w) for db in self._catalog.databases() for w in self.watermarks(db)]
