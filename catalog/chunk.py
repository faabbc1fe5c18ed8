"""A chunk: an immutable set of rows of one table partition, held by Spark.

Invariant: a chunk's rows never change after it is created; lifecycle actions
replace chunks with new ones (compaction, persist) and only its `state` and the
delete predicates attached to it move. Its data lives in Spark (a locally
checkpointed DataFrame registered as a global temp view), so the driver holds
metadata only; `order` keeps the write-buffer order of chunks in a partition.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Chunk", "ChunkState", "CHUNK_STATES"]

ChunkState = str
#: open: newest chunk of its partition; closed: older in-memory chunk;
#: compacting/persisting: a lifecycle action reads it; persisted: in memory and in Parquet;
#: unloaded: in Parquet only.
CHUNK_STATES = ("open", "closed", "compacting", "persisting", "persisted", "unloaded")


@dataclass
class Chunk:
    id: int
    table: str
    partition_key: str
    order: int
    state: ChunkState
    rows: int
    size_bytes: int
    min_time_ns: int
    max_time_ns: int
    #: column name -> (role, type) of the columns this chunk holds
    columns: list
    #: global temp view holding the rows in memory (None once unloaded)
    view: str | None
    #: per Kafka partition (min offset, max offset) of the rows it holds
    offsets: dict = field(default_factory=dict)
    #: Spark DataFrame backing `view` (kept referenced so its checkpoint blocks stay alive)
    df: Any = None
    #: Parquet object keys holding the same rows (persisted/unloaded chunks)
    parquet_keys: list = field(default_factory=list)
    #: wall time (s) the chunk was created (its last write)
    created_at: float = 0.0
    #: no two rows share (tags, time): the output of a merge (compaction, persist, Parquet
    #: files); chunks straight from the write buffer may hold duplicates
    deduplicated: bool = False

    def column_names(self) -> set:
        return {c[0] for c in self.columns}
