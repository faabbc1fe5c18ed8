"""Compact the persisted chunks of one partition: many Parquet files -> one file, one commit.

When it runs: the lifecycle worker executes a `CompactPersistedChunks` action
(the policy asks for it once a partition has `persisted_compaction_file_threshold`
files, or >= 2 files and no write for the late-arrival window). It stops when
the commit is done, or when it failed and was rolled back (the partition is as
before; at most an orphan file is left, which cleanup deletes).

Invariants (IOx compact_object_store_chunks):
- The new file holds exactly the deduplicated rows of the files it replaces,
  with every known delete applied and every row keeping the newest `_iox_seq`
  merged into it, so every query answers the same before and after.
- One preserved-catalog transaction adds the new file and removes the old ones;
  checkpoints do not move (no row enters or leaves Parquet). Before the commit
  a crash leaves the old files in force; after it, the new one.
- The replaced chunks are retired, not released: queries planned before the
  swap still read them (cleanup keeps the files retired chunks read).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from catalog.catalog import Catalog, Database
from catalog.chunk import Chunk
from catalog.object_store import ObjectStore, parquet_key
from catalog.preserved_catalog import RemoveParquet, SetTableSchema

from server.crash_points import crash_point

from .chunk_data import (merged_df, register_df_chunk, register_parquet_chunk, release_df, schema_bytes,
                         table_deletes)
from .persist import InFlightFiles, add_parquet_action, write_one_file

__all__ = ["PersistedCompaction", "compact_persisted_chunks"]

log = logging.getLogger(__name__)

_STORED = ("persisted", "unloaded")


@dataclass(frozen=True)
class PersistedCompaction:
    table: str
    partition_key: str
    #: Parquet keys replaced, and the key that replaced them (None: every row was deleted)
    removed: tuple
    added: str | None
    rows: int
    revision: int


def compact_persisted_chunks(spark, catalog: Catalog, db: Database, table: str, partition_key: str,
                             chunk_ids: tuple | None, store: ObjectStore, preserved, in_flight: InFlightFiles,
                             now: float, refresh_view, cache_dir: str | None = None) -> PersistedCompaction | None:
    """Merges `chunk_ids` (None: every persisted chunk of the partition) into one file. Driver only.

    Returns None when there is nothing to do (fewer than 2 such chunks, the
    partition busy, or a chunk named is gone). Raises what the commit raises
    (RevisionConflict: the caller must stop).
    """
    with catalog.lock:
        part = catalog.get_partition(db, table, partition_key)
        if part is None or part.persisting or part.compacting:
            return None
        stored = [c for c in part.live_chunks() if c.state in _STORED and c.parquet_keys]
        if chunk_ids is not None:
            wanted = set(chunk_ids)
            stored = [c for c in stored if c.id in wanted]
            if len(stored) != len(wanted):
                return None
        if len(stored) < 2:
            return None
        in_memory = any(c.df is not None for c in stored)
        # "unloaded" only stays "unloaded": a chunk read from Parquet since its persist is "persisted"
        state = "persisted" if any(c.state == "persisted" for c in stored) else "unloaded"
        part.compacting = True
    old_keys = tuple(k for c in stored for k in c.parquet_keys)
    key = parquet_key(db.name, table, partition_key, uuid.uuid4())
    merged = None
    try:
        schema = db.schemas.get(table)
        merged = merged_df(spark, schema, stored, table_deletes(db, table))
        if in_memory:
            merged = merged.localCheckpoint(eager=True)
        in_flight.add([key])
        meta = write_one_file(merged, store, key)
        actions = [SetTableSchema(table, tuple(tuple(c) for c in schema.to_json()))]
        added = [add_parquet_action(m, table, partition_key, schema) for m in meta]
        actions += added
        actions += [RemoveParquet(k) for k in old_keys]
        crash_point("compact_persisted_after_parquet")
        revision = preserved.commit(actions, now)
        crash_point("compact_persisted_after_commit")
    except BaseException:
        with catalog.lock:
            part.compacting = False
        in_flight.discard([key])
        if in_memory:
            release_df(merged)  # its checkpoint blocks, if it got that far
        raise
    in_flight.discard([key])
    with catalog.lock:
        new_chunks = []
        for f in added:
            cid = catalog.next_chunk_id()
            if in_memory:
                view, df = register_df_chunk(merged, cid), merged
            else:
                view, df = register_parquet_chunk(spark, store, [f.key], schema.to_json(), cid, cache_dir), None
            new_chunks.append(Chunk(id=cid, table=table, partition_key=partition_key, order=0, state=state,
                                    rows=f.row_count, size_bytes=schema_bytes(f.row_count, schema),
                                    min_time_ns=f.min_time_ns, max_time_ns=f.max_time_ns, columns=schema.to_json(),
                                    view=view, offsets={}, df=df, parquet_keys=[f.key],
                                    created_at=max(c.created_at for c in stored), deduplicated=True))
        catalog.replace_chunks(db, table, partition_key, [c.id for c in stored], new_chunks)
        gone = set(old_keys)
        part.files = [f for f in part.files if f.key not in gone] + added
        part.compacting = False
    if in_memory and not added:
        release_df(merged)  # every row was deleted: the empty checkpoint backs no chunk
    refresh_view(db, table)
    catalog.retire(stored, now)
    rows = sum(f.row_count for f in added)
    new_key = added[0].key if added else None
    log.info("compacted %d Parquet files of %s/%s/%s into %s (%d rows), revision %d", len(old_keys), db.name, table,
             partition_key, new_key or "nothing", rows, revision)
    return PersistedCompaction(table, partition_key, old_keys, new_key, rows, revision)
