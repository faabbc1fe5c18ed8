"""The in-memory catalog: database -> table -> partition (UTC day) -> chunks.

Invariants:
- Chunks of a partition are kept in write-buffer order (`Chunk.order`).
- `applied_hi_inclusive[kp]` of a database is the highest Kafka offset whose
  message is fully applied (queryable); it only grows, and every offset at or
  below it is applied (micro-batches are applied whole, in order).
- All mutation happens under the catalog lock; readers get snapshots.

Runs on the driver only.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from .chunk import Chunk
from .schema import SchemaRegistry, TableSchema

__all__ = ["Catalog", "Database", "TablePartition", "DatabaseNotFoundError"]


class DatabaseNotFoundError(KeyError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(name)


@dataclass
class TablePartition:
    table: str
    key: str
    chunks: list = field(default_factory=list)

    def live_chunks(self) -> list:
        return sorted(self.chunks, key=lambda c: c.order)


@dataclass
class Database:
    name: str
    topic: str
    kafka_partitions: int
    schemas: SchemaRegistry = field(default_factory=SchemaRegistry)
    #: table -> partition key -> TablePartition
    partitions: dict = field(default_factory=dict)
    applied_hi_inclusive: dict = field(default_factory=dict)

    def table_names(self) -> list[str]:
        return sorted(self.partitions)


class Catalog:
    """Thread-safe registry of databases and their chunks."""

    def __init__(self):
        self._lock = threading.RLock()
        self._dbs: dict[str, Database] = {}
        self._chunk_ids = itertools.count(1)
        self._orders = itertools.count(1)

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def next_chunk_id(self) -> int:
        return next(self._chunk_ids)

    def next_order(self) -> int:
        return next(self._orders)

    def ensure_database(self, name: str, topic: str, kafka_partitions: int) -> Database:
        with self._lock:
            db = self._dbs.get(name)
            if db is None:
                db = Database(name, topic, kafka_partitions)
                db.applied_hi_inclusive = {p: -1 for p in range(kafka_partitions)}
                self._dbs[name] = db
            return db

    def database(self, name: str) -> Database:
        with self._lock:
            db = self._dbs.get(name)
            if db is None:
                raise DatabaseNotFoundError(name)
            return db

    def has_database(self, name: str) -> bool:
        with self._lock:
            return name in self._dbs

    def databases(self) -> list[Database]:
        with self._lock:
            return [self._dbs[k] for k in sorted(self._dbs)]

    def add_chunk(self, db: Database, chunk: Chunk) -> list[Chunk]:
        """Adds a chunk as the newest of its partition; the previous open chunk becomes closed.

        Returns the chunks of the partition after the change.
        """
        with self._lock:
            parts = db.partitions.setdefault(chunk.table, {})
            part = parts.setdefault(chunk.partition_key, TablePartition(chunk.table, chunk.partition_key))
            for c in part.chunks:
                if c.state == "open":
                    c.state = "closed"
            part.chunks.append(chunk)
            return part.live_chunks()

    def advance_applied(self, db: Database, hi_inclusive: dict) -> None:
        with self._lock:
            for kp, off in hi_inclusive.items():
                if off > db.applied_hi_inclusive.get(kp, -1):
                    db.applied_hi_inclusive[kp] = off

    def table_chunks(self, db: Database, table: str) -> list[Chunk]:
        with self._lock:
            out = []
            for key in sorted(db.partitions.get(table, {})):
                out.extend(db.partitions[table][key].live_chunks())
            return out

    def table_schema(self, db: Database, table: str) -> TableSchema | None:
        return db.schemas.get(table)
