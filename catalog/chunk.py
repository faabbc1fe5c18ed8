"""A chunk: an immutable set of rows of one table partition, held by Spark.

Invariant: a chunk's rows never change after it is created; lifecycle actions
replace chunks with new ones (compaction, persist) and only its `state` and the
delete predicates attached to it move. Its data lives in Spark (a locally
checkpointed DataFrame registered as a global temp view), so the driver holds
metadata only; `order` keeps the write-buffer order of chunks in a partition.

A chunk's rows are held in one or two forms (IOx: the mutable buffer and the
read buffer): `segments`, the write-buffer form (the Kafka payloads' Arrow IPC
streams, cheap to build and to persist, decoded wherever they are read; see
chunk_store/ipc_segments.py), and `df`, the read form (deduplicated rows in
Spark, fast to query). Both hold the same rows; the view reads `df` when there
is one. A chunk with neither is read from its Parquet files.
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
    #: the read form: Spark DataFrame of rows (kept referenced so its checkpoint blocks stay alive)
    df: Any = None
    #: Parquet object keys holding the same rows (persisted/unloaded chunks)
    parquet_keys: list = field(default_factory=list)
    #: wall time (s) the chunk was created (its last write)
    created_at: float = 0.0
    #: no two rows share (tags, time): the output of a merge (compaction, persist, Parquet
    #: files); chunks straight from the write buffer may hold duplicates
    deduplicated: bool = False
    #: the write-buffer form: checkpointed DataFrames of Arrow IPC streams, in write-buffer order
    #: (chunk_store/ipc_segments.py); empty when the chunk has none
    segments: list = field(default_factory=list)
    #: no two rows of the write-buffer form share (tags, time) (the writers said so, and its streams
    #: do not overlap in time)
    segments_deduplicated: bool = False
    #: bytes of the write-buffer form (IPC streams), part of `size_bytes`
    segment_bytes: int = 0
    #: where in time the rows lie, finer than [min_time_ns, max_time_ns] (catalog/time_spans.py);
    #: () = the hull
    time_spans: tuple = ()
    #: global temp views of Arrow merges this chunk is part of (chunk_store/chunk_data.py
    #: `arrow_merge_relations`), dropped with the chunk's data
    merge_views: set = field(default_factory=set)
    #: a local chunk's rows, held on the driver (a pyarrow Table in the chunk layout of `columns`;
    #: chunk_store/local_rows.py): its view is a local relation of them; None for any other chunk
    local_rows: Any = None

    def column_names(self) -> set:
        return {c[0] for c in self.columns}

    # The operations below are the only writers of a chunk's fields outside catalog/ (the
    # lifecycle's actions, the consume path); the caller holds Catalog.lock.
    def close(self) -> None:
        """An open chunk takes no more rows (a delete or a compaction is about to read it)."""
        if self.state == "open":
            self.state = "closed"

    def unload(self) -> None:
        """Its rows are read from Parquet only from now on; the caller retires its in-memory form."""
        self.df = None
        self.state = "unloaded"

    def hand_over_df(self) -> None:
        """Its read form now backs another chunk: retiring this one frees only its view."""
        self.df = None

    def add_merge_view(self, name: str) -> None:
        """An Arrow merge view `name` reads this chunk (chunk_store/chunk_data.py): dropped with its data."""
        self.merge_views.add(name)

    def take_merge_views(self) -> list:
        """The merge views that read this chunk, forgotten here (the caller drops them)."""
        views = list(self.merge_views)
        self.merge_views.clear()
        return views

    def release_local_rows(self) -> None:
        """A local chunk's rows are no longer held on the driver."""
        self.local_rows = None

    def hand_over_segments(self) -> None:
        """Its write-buffer form now belongs to another chunk: retiring this one frees only its views and rows."""
        self.segments = []

    @property
    def in_memory(self) -> bool:
        """Some form of the rows is held in Spark (not only in Parquet)."""
        return self.df is not None or bool(self.segments)

    @property
    def storage(self) -> str:
        """Where the rows are read from: "read_buffer" (rows), "write_buffer" (IPC segments only),
        "object_store" (Parquet only); "+write_buffer" is appended when a read buffer chunk also
        keeps its write-buffer form (persist writes from it)."""
        if self.df is not None:
            return "read_buffer+write_buffer" if self.segments else "read_buffer"
        return "write_buffer" if self.segments else "object_store"
