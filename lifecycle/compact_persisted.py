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
  a crash leaves the old files in force; after it, the new one, which its
  writer made durable before the commit (persist's `write_one_file` /
  `write_files`).
- The replaced chunks are retired, not released: queries planned before the
  swap still read them (cleanup keeps the files retired chunks read).

How: files none of whose chunks is held in memory, at most `ARROW_COMPACTION_MAX_ROWS`
rows in all, and whose deletes Arrow evaluates are merged in ONE executor task
in Arrow (`arrow_compaction_fn`: read with pyarrow, chunk_store/arrow_merge.py's
`apply_deletes` and `deduplicate`, one Parquet file written): 22M rows of the
bench's sustained load in ~10 s on one core, where Spark's GROUP BY of every
row took both cores for ~60 s, holding the lifecycle worker (persists wait for
it: it runs one action at a time) and the micro-batches' task slots. Others
take Spark's merge (`merged_df`), which spills to disk.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from iox_spark.catalog.catalog import COMPACTING, Catalog, Database
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.partition_moves import claim_persisted_to_compact, give_back, swap_compacted
from iox_spark.catalog.object_store import ObjectStore, parquet_key
from iox_spark.catalog.preserved_catalog import RemoveParquet, SetTableSchema

from iox_spark.catalog.crash_points import CrashPoint, crash_point

from iox_spark.chunk_store.chunk_checkpoint import checkpoint
from iox_spark.chunk_store.chunk_data import (arrow_deletes_meeting, merged_df, register_df_chunk, register_parquet_chunk, release_df,
                         schema_bytes, time_disjoint)
from iox_spark.lifecycle.persist import FILE_META_SCHEMA, InFlightFiles, add_parquet_action, layout_columns, write_one_file

__all__ = ["ARROW_COMPACTION_MAX_ROWS", "PersistedCompaction", "compact_persisted_chunks", "arrow_compaction_fn",
           "stored_arrow_plan"]

log = logging.getLogger(__name__)

_STORED = ("persisted", "unloaded")

#: files holding more rows than this in all are merged by Spark (which spills to disk), not in one
#: Python worker's memory (22M rows of the bench's 5-column table peaked at ~3 GB: ~135 bytes a row)
ARROW_COMPACTION_MAX_ROWS = 32_000_000


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
                             now: float, refresh_view, cache=None) -> PersistedCompaction | None:
    """Merges `chunk_ids` (None: every persisted chunk of the partition) into one file. Driver only.

    Returns None when there is nothing to do (fewer than 2 such chunks, the
    partition busy, or a chunk named is gone). Raises what the commit raises
    (RevisionConflict: the caller must stop).
    """
    claimed = claim_persisted_to_compact(catalog, db, table, partition_key, chunk_ids, _STORED)
    if claimed is None:
        return None
    part, stored, in_memory, state = claimed
    old_keys = tuple(k for c in stored for k in c.parquet_keys)
    key = parquet_key(db.name, table, partition_key, uuid.uuid4())
    merged = plan = None
    try:
        schema = db.schemas.get(table)
        deletes = db.table_deletes(table)
        plan = None if in_memory else stored_arrow_plan(stored, schema, deletes)
        in_flight.add([key])
        if plan is not None:
            meta = _arrow_compact(spark, store, stored, key, schema, *plan)
        else:
            merged = merged_df(spark, schema, stored, deletes)
            if in_memory:
                merged = checkpoint(merged)
            meta = write_one_file(merged, store, key)
        actions = [SetTableSchema(table, tuple(tuple(c) for c in schema.to_json()))]
        added = [add_parquet_action(m, table, partition_key, schema) for m in meta]
        actions += added
        actions += [RemoveParquet(k) for k in old_keys]
        crash_point(CrashPoint.COMPACT_PERSISTED_AFTER_PARQUET)
        revision = preserved.commit(actions, now)
        crash_point(CrashPoint.COMPACT_PERSISTED_AFTER_COMMIT)
    except BaseException:
        give_back(catalog, part, COMPACTING)
        in_flight.discard([key])
        if in_memory:
            release_df(merged)  # its checkpoint blocks, if it got that far
        raise
    in_flight.discard([key])
    new_chunks = []
    for f in added:
        cid = catalog.next_chunk_id()
        if in_memory:
            view, df = register_df_chunk(spark, merged, cid), merged
        else:
            view, df = register_parquet_chunk(spark, store, [f.key], schema.to_json(), cid, cache,
                                              [f.size_bytes]), None
        new_chunks.append(Chunk(id=cid, table=table, partition_key=partition_key, order=0, state=state,
                                rows=f.row_count, size_bytes=schema_bytes(f.row_count, schema),
                                min_time_ns=f.min_time_ns, max_time_ns=f.max_time_ns, columns=schema.to_json(),
                                view=view, offsets={}, df=df, parquet_keys=[f.key],
                                created_at=max(c.created_at for c in stored), deduplicated=True))
    swap_compacted(catalog, db, table, partition_key, part, stored, new_chunks, replaced_files=(old_keys, added))
    if in_memory and not added:
        release_df(merged)  # every row was deleted: the empty checkpoint backs no chunk
    refresh_view(db, table)
    catalog.retire(stored, now)
    rows = sum(f.row_count for f in added)
    new_key = added[0].key if added else None
    log.info("compacted %d Parquet files of %s/%s/%s into %s (%d rows, merged %s), revision %d", len(old_keys), db.name,
             table, partition_key, new_key or "nothing", rows, "in Arrow" if plan is not None else "by Spark", revision)
    return PersistedCompaction(table, partition_key, old_keys, new_key, rows, revision)


def stored_arrow_plan(stored: list, schema, deletes: list) -> tuple | None:
    """(ArrowDelete list, whether to deduplicate) when `stored` (chunks read from Parquet only) can
    be merged in Arrow: at most ARROW_COMPACTION_MAX_ROWS rows and every delete term that meets
    their time span evaluable in Arrow; else None. Deduplication is skipped when every file is
    deduplicated and no two meet in time. Pure (driver)."""
    if sum(c.rows for c in stored) > ARROW_COMPACTION_MAX_ROWS:
        return None
    arrow_deletes = arrow_deletes_meeting(stored, schema, deletes)
    if arrow_deletes is None:
        return None
    return arrow_deletes, not (all(c.deduplicated for c in stored) and time_disjoint(stored))


def _arrow_compact(spark, store: ObjectStore, stored: list, key: str, schema, deletes: list, dedup: bool) -> list:
    """Runs `arrow_compaction_fn` as one task (driver side); returns `write_one_file`'s metadata."""
    columns = layout_columns(schema)
    fn = arrow_compaction_fn(store, [k for c in stored for k in c.parquet_keys], key, columns,
                              list(schema.tags()), [f.name for f in schema.fields()], deletes, dedup)
    return spark.range(0, 1, 1, 1).mapInArrow(fn, FILE_META_SCHEMA).collect()


def arrow_compaction_fn(store: ObjectStore, file_keys: list, key: str, columns: list, tags: list, fields: list,
                         deletes: list, dedup: bool):
    """mapInArrow function of ONE task (executor side): reads `file_keys` with pyarrow in the
    chunk layout of `columns` [(name, type)] (a column a file lacks reads as NULL), applies
    `deletes` (ArrowDelete), deduplicates when `dedup`, writes the rows as one Parquet file at
    `key` (persist's `write_files`) and yields its metadata in `write_one_file`'s schema
    (nothing when no row is left). Picklable (the store config and plain data)."""

    def fn(batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN

        from iox_spark.chunk_store.arrow_merge import apply_deletes, deduplicate
        from iox_spark.chunk_store.ipc_segments import arrow_type, chunk_arrow_schema
        from iox_spark.lifecycle.persist import write_files

        for _ in batches:  # the one input row only starts the task
            pass
        target = chunk_arrow_schema(columns)
        fs, _base = store.arrow_fs()
        parts = []
        for k in file_keys:
            f = pq.read_table(store.arrow_path(k), filesystem=fs)
            have = set(f.column_names)
            # a persisted file's column has the table's type (a conflicting write is refused), so a
            # failing cast is an error, not a NULL
            arrays = [pc.cast(f.column(n), arrow_type(t)) if n in have else pa.nulls(f.num_rows, arrow_type(t))
                      for n, t in columns]
            parts.append(pa.Table.from_arrays(arrays + [f.column(TIME_NS_COLUMN), f.column(SEQ_COLUMN)],
                                              schema=target))
        t = pa.concat_tables(parts)
        del parts
        t = apply_deletes(t, deletes, dict(columns))
        if dedup:
            t = deduplicate(t, tags, fields)
        if t.num_rows:
            # one key: one file, whatever the row count
            [(_key, rows, size, (min_t, max_t, min_seq, max_seq))] = write_files(store, [key], t, t.num_rows)
            yield pa.RecordBatch.from_pylist([{"key": key, "rows": rows, "size": size, "min_t": min_t, "max_t": max_t,
                                               "min_seq": min_seq, "max_seq": max_seq}])
        del t
        # the Python worker lives on (reused): hand the merge's memory back to the OS
        pa.default_memory_pool().release_unused()

    return fn
