"""Unload a persisted chunk from memory: its rows stay queryable from its Parquet files.

When it runs: the lifecycle worker executes an `UnloadChunk` action under
memory pressure. Invariant: the chunk's view is re-pointed at its Parquet files
(same rows) before its in-memory blocks are released, so no query sees a gap.
"""
from __future__ import annotations

import dataclasses
import logging

from iox_spark.catalog.catalog import Catalog, Database
from iox_spark.catalog.partition_moves import claim_to_unload, mark_unloaded

from iox_spark.chunk_store.chunk_data import register_parquet_chunk

__all__ = ["unload_chunk"]

log = logging.getLogger(__name__)


def unload_chunk(spark, catalog: Catalog, db: Database, table: str, partition_key: str, chunk_id: int, store,
                 cache=None) -> bool:
    claimed = claim_to_unload(catalog, db, table, partition_key, chunk_id)
    if claimed is None:
        return False
    chunk, df = claimed
    register_parquet_chunk(spark, store, chunk.parquet_keys, chunk.columns, chunk.id, cache)
    mark_unloaded(catalog, chunk)
    # the in-memory blocks go after the grace period: a query planned before may still read them
    catalog.retire([dataclasses.replace(chunk, view=None, df=df, merge_views=set())])
    log.info("unloaded chunk %d of %s/%s/%s", chunk_id, db.name, table, partition_key)
    return True
