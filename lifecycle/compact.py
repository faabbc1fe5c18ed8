"""Compact a contiguous run of in-memory chunks of one partition into one chunk.

When it runs: the lifecycle worker executes a `CompactChunks` action (or a user
runs `iox compact`). Invariant: the new chunk holds exactly the rows of the run
(order kept: it takes the run's place, and every row keeps its `_iox_seq`), so
every query answers the same before and after; the replaced chunks' data is
released only after a grace period.

Two ways, by the forms the chunks are held in (catalog/chunk.py):
- write-buffer chunks merged into a write-buffer chunk: the new chunk takes over
  the run's segments as they are (no Spark job, no row decoded); it is known to
  be deduplicated when each of them was and no two meet in time; a join of
  local chunks (chunk_store/local_rows.py) of at most LOCAL_CHUNK_MAX_ROWS rows is
  local too (their rows joined on the driver);
- otherwise (`to_read_buffer`, or chunks that have a read form) the chunks are
  merged into deduplicated rows with the deletes materialised, the read form:
  on the driver when every chunk is local, they hold at most
  LOCAL_CHUNK_MAX_ROWS rows and every delete is evaluable in Arrow
  (local_rows.merged_local_rows: no Spark job; the read form is a local
  relation and the new chunk stays local, so queries of it run no job either),
  else in Arrow from the write-buffer form when every chunk holds it and every
  delete is evaluable in Arrow (chunk_data.arrow_merged_df, the way persist
  merges; from 100k rows by `arrow_merge_parts` tasks side by side, each the
  rows of one part of a hash of the time, so queries of the result read the
  parts side by side too), else in Spark SQL over their views; when every
  chunk of the run holds the write-buffer form the new chunk keeps it too
  (persist writes from it).
"""
from __future__ import annotations

import logging

import pyarrow.compute as pc

from iox_spark.catalog.catalog import COMPACTING, Catalog, Database
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.partition_moves import claim_to_compact, give_back, swap_compacted
from iox_spark.catalog.schema import TIME_NS_COLUMN

from iox_spark.catalog.crash_points import CrashPoint, crash_point

from iox_spark.chunk_store.chunk_checkpoint import checkpoint
from iox_spark.chunk_store.cluster import task_slots
from iox_spark.chunk_store.chunk_data import (arrow_merge_parts, arrow_merged_df, arrow_plan, merged_df, merged_spans, register_df_chunk,
                         row_stats, schema_bytes, time_disjoint)
from iox_spark.chunk_store.ipc_segments import register_segments_chunk
from iox_spark.chunk_store.local_rows import joined_local_rows, local_df, merged_local_rows, register_local_chunk

__all__ = ["compact_chunks"]

log = logging.getLogger(__name__)


def compact_chunks(spark, catalog: Catalog, db: Database, table: str, partition_key: str, chunk_ids: tuple | None,
                   now: float, refresh_view, to_read_buffer: bool = True) -> Chunk | None:
    """Compacts `chunk_ids` (None: every in-memory unpersisted chunk). Returns the new chunk or None.

    A run of one chunk is compacted only `to_read_buffer` (it moves to the read buffer)."""
    claimed = claim_to_compact(catalog, db, table, partition_key, chunk_ids, to_read_buffer)
    if claimed is None:
        return None
    part, chunks = claimed
    schema = db.schemas.get(table)
    keep_segments = all(c.segments for c in chunks)
    segments = [s for c in chunks for s in c.segments] if keep_segments else []
    segment_bytes = sum(c.segment_bytes for c in chunks) if keep_segments else 0
    segments_dedup = keep_segments and all(c.segments_deduplicated for c in chunks) and time_disjoint(chunks)
    as_segments = keep_segments and not to_read_buffer and all(c.df is None for c in chunks)
    df = local_read = None
    try:
        # a merge of local chunks is small: computed on the driver, its read form a local relation
        if not as_segments:
            local_read = merged_local_rows(chunks, schema, db.table_deletes(table))
        if as_segments:
            rows = sum(c.rows for c in chunks)
            lo, hi = min(c.min_time_ns for c in chunks), max(c.max_time_ns for c in chunks)
        elif local_read is not None:
            merged = local_read[1]
            df = local_df(spark, merged, schema.to_json())
            rows = merged.num_rows
            mm = pc.min_max(merged.column(TIME_NS_COLUMN))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
        else:
            deletes = db.table_deletes(table)
            plan = arrow_plan(chunks, schema, deletes)
            # the parts of an Arrow merge are computed side by side: the move is over sooner, and
            # queries meanwhile merge the write-buffer form themselves (seconds each for 10M rows;
            # one part at a time made the bench's 10M-point move ~18 s and its queries 7 s)
            parts = arrow_merge_parts(chunks, task_slots(spark))
            merged = (arrow_merged_df(spark, schema, chunks, plan, deletes, parts=parts)
                      if plan is not None else merged_df(spark, schema, chunks, deletes))
            df = checkpoint(merged)
            st = row_stats(df)
            rows, lo, hi = st["n"], st["lo"], st["hi"]
    except BaseException:
        give_back(catalog, part, COMPACTING, chunks, "closed")
        raise
    if lo is None:  # every row was deleted: the chunk keeps its inputs' time bounds (persist then flushes
        # their windows, and the policy compares bounds as numbers)
        lo, hi = min(c.min_time_ns for c in chunks), max(c.max_time_ns for c in chunks)
    crash_point(CrashPoint.COMPACT_BEFORE_SWAP)
    cid = catalog.next_chunk_id()
    columns = schema.to_json()
    # a join of local chunks stays local while it is small (chunk_store/local_rows.py); a merge of
    # them keeps their joined rows too
    if as_segments:
        local = joined_local_rows(chunks, columns)
    else:
        local = local_read[0] if local_read is not None else None
    # the read form's bytes: the merged rows of a local merge, else the estimate of a checkpoint's
    read_bytes = local_read[1].nbytes if local_read is not None else schema_bytes(rows, schema) if df is not None else 0
    if local is not None and df is None:
        view = register_local_chunk(spark, local, columns, cid)
    else:
        view = register_segments_chunk(spark, segments, columns, cid) if as_segments else register_df_chunk(spark, df, cid)
    offsets: dict = {}
    for c in chunks:
        for kp, (a_lo, a_hi) in c.offsets.items():
            a, b = offsets.get(kp, (a_lo, a_hi))
            offsets[kp] = (min(a, a_lo), max(b, a_hi))
    new = Chunk(id=cid, table=table, partition_key=partition_key, order=0, state="closed", rows=rows,
                size_bytes=segment_bytes + (local.nbytes if local is not None else 0) + read_bytes,
                local_rows=local,
                min_time_ns=lo, max_time_ns=hi, columns=columns, view=view, offsets=offsets, df=df,
                created_at=max(c.created_at for c in chunks),
                deduplicated=segments_dedup if as_segments else True, segments=segments,
                segments_deduplicated=segments_dedup, segment_bytes=segment_bytes,
                time_spans=merged_spans(chunks, lo, hi) if rows else ())
    swap_compacted(catalog, db, table, partition_key, part, chunks, [new], hand_over_segments=keep_segments)
    refresh_view(db, table)
    catalog.retire(chunks, now)
    log.info("compacted %d chunks of %s/%s/%s into chunk %d (%d rows, %s)", len(chunks), db.name, table,
             partition_key, cid, rows, new.storage)
    return new
