"""Compact a contiguous run of in-memory chunks of one partition into one chunk.

When it runs: the lifecycle worker executes a `CompactChunks` action (or a user
runs `iox compact`). Invariant: the new chunk holds exactly the deduplicated
rows of the run (order kept: it takes the run's place, and every row keeps the
newest `_iox_seq` merged into it), so every query answers the same before and
after; the replaced chunks' data is released only after a grace period.
"""
from __future__ import annotations

import logging

from catalog.catalog import Catalog, Database
from catalog.chunk import Chunk

from server.crash_points import crash_point

from .chunk_data import merged_df, register_df_chunk, row_stats, schema_bytes, table_deletes

__all__ = ["compact_chunks"]

log = logging.getLogger(__name__)


def compact_chunks(spark, catalog: Catalog, db: Database, table: str, partition_key: str, chunk_ids: tuple | None,
                   now: float, refresh_view) -> Chunk | None:
    """Compacts `chunk_ids` (None: every in-memory unpersisted chunk). Returns the new chunk or None."""
    with catalog.lock:
        part = catalog.get_partition(db, table, partition_key)
        if part is None or part.persisting or part.compacting:
            return None
        live = part.live_chunks()
        if chunk_ids is None:
            chunks = [c for c in live if c.state in ("open", "closed")]
        else:
            chunks = [c for c in live if c.id in set(chunk_ids)]
            if len(chunks) != len(chunk_ids) or any(c.state not in ("open", "closed") for c in chunks):
                return None
        if len(chunks) < 2:
            return None
        # contiguous: no other chunk of the partition sits between the first and last
        positions = [live.index(c) for c in chunks]
        if positions != list(range(positions[0], positions[0] + len(chunks))):
            return None
        for c in chunks:
            c.state = "compacting"
        part.compacting = True
    try:
        schema = db.schemas.get(table)
        df = merged_df(spark, schema, chunks, table_deletes(db, table)).localCheckpoint(eager=True)
        st = row_stats(df)
    except BaseException:
        with catalog.lock:
            for c in chunks:
                c.state = "closed"
            part.compacting = False
        raise
    crash_point("compact_before_swap")
    with catalog.lock:
        cid = catalog.next_chunk_id()
        offsets: dict = {}
        for c in chunks:
            for kp, (lo, hi) in c.offsets.items():
                a, b = offsets.get(kp, (lo, hi))
                offsets[kp] = (min(a, lo), max(b, hi))
        new = Chunk(id=cid, table=table, partition_key=partition_key, order=0, state="closed", rows=st["n"],
                    size_bytes=schema_bytes(st["n"], schema), min_time_ns=st["lo"], max_time_ns=st["hi"],
                    columns=schema.to_json(), view=register_df_chunk(df, cid), offsets=offsets, df=df,
                    created_at=max(c.created_at for c in chunks), deduplicated=True)
        catalog.replace_chunks(db, table, partition_key, [c.id for c in chunks], [new])
        part.compacting = False
    refresh_view(db, table)
    catalog.retire(chunks, now)
    log.info("compacted %d chunks of %s/%s/%s into chunk %d (%d rows)", len(chunks), db.name, table,
             partition_key, cid, st["n"])
    return new
