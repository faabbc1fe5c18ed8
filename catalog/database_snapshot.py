"""A database's state at one instant, copied for readers that hold no lock: what `iox status`
(server/status_document.py) shows of a database.

Invariant: a snapshot is taken whole under the catalog's lock (`Database.snapshot`), so it never
shows a chunk twice, or a file and the chunk it replaced; it shares nothing mutable with the
catalog (lists and dicts are copied, chunks and poisoned messages are copied into values), so a
reader may keep it as long as it likes.

Runs on the driver only. No clock is read here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["ChunkSnapshot", "PartitionSnapshot", "TableSnapshot", "DatabaseSnapshot", "snapshot_of"]


@dataclass(frozen=True)
class ChunkSnapshot:
    id: int
    state: str
    rows: int
    size_bytes: int
    min_time_ns: int
    max_time_ns: int
    #: where its rows are read from (`Chunk.storage`)
    storage: str


@dataclass(frozen=True)
class PartitionSnapshot:
    key: str
    #: rows its persistence windows hold (0 before its first write)
    unpersisted_rows: int
    #: its Parquet files registered in the preserved catalog
    files: tuple
    #: the last partition checkpoint committed for it (a frozen PartitionCheckpoint), or None
    checkpoint: object
    #: its live chunks, in write-buffer order
    chunks: tuple[ChunkSnapshot, ...]


@dataclass(frozen=True)
class TableSnapshot:
    name: str
    #: the table's columns (frozen Column values), empty when no schema is known yet
    columns: tuple
    partitions: tuple[PartitionSnapshot, ...]


@dataclass(frozen=True)
class DatabaseSnapshot:
    name: str
    topic: str
    kafka_partitions: int
    epoch: int
    pending_transaction_parts: int
    pinned_transactions: int
    #: LostWriteRange values (frozen), accepted or not
    lost_writes: tuple
    #: copies of the PoisonedMessage records
    poisoned: tuple
    #: {kp: (count, last offset, last reason)} of messages skipped as unreadable
    skipped_messages: dict
    topic_replaced: bool
    retention_period_s: int | None
    pruner_hi_ns: int | None
    #: the Kafka partitions this server owns in a pool; None outside one
    owned_partitions: frozenset | None
    #: every table with a schema or a partition, by name
    tables: tuple[TableSnapshot, ...]


def _chunk(c) -> ChunkSnapshot:
    return ChunkSnapshot(id=c.id, state=c.state, rows=c.rows, size_bytes=c.size_bytes, min_time_ns=c.min_time_ns,
                         max_time_ns=c.max_time_ns, storage=c.storage)


def _partition(part) -> PartitionSnapshot:
    return PartitionSnapshot(key=part.key, unpersisted_rows=part.windows.unpersisted_row_count() if part.windows else 0,
                             files=tuple(part.files), checkpoint=part.checkpoint,
                             chunks=tuple(_chunk(c) for c in part.live_chunks()))


def snapshot_of(db) -> DatabaseSnapshot:
    """The snapshot of the Database `db`. Called by `Database.snapshot`, under the catalog's lock."""
    tables = []
    for table in sorted(set(db.schemas.tables()) | set(db.partitions)):
        sch = db.schemas.get(table)
        by_key = db.partitions.get(table, {})
        tables.append(TableSnapshot(name=table, columns=tuple(sch.columns) if sch else (),
                                    partitions=tuple(_partition(by_key[k]) for k in sorted(by_key))))
    return DatabaseSnapshot(
        name=db.name, topic=db.topic, kafka_partitions=db.kafka_partitions, epoch=db.epoch,
        pending_transaction_parts=len(db.txns.pending), pinned_transactions=len(db.txns.pins),
        lost_writes=tuple(db.lost_writes), poisoned=tuple(dataclasses.replace(r) for r in db.poisoned),
        skipped_messages=dict(db.skipped_messages), topic_replaced=db.topic_replaced,
        retention_period_s=db.retention_period_s, pruner_hi_ns=db.pruner_hi_ns,
        owned_partitions=db.owned_partitions, tables=tuple(tables))
