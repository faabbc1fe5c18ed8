"""Spark-side chunk data: merge chunks, register chunk views, read Parquet chunks.

Invariant: a chunk's data is registered exactly once under its own global temp
view (`iox_chunk_<id>`) and never changed; merging keeps write-buffer order by
deduplicating on (tags, time) with the last non-null value per field by
`_iox_seq` and keeping the newest `_iox_seq` of every merged row.

Runs on the driver (builds plans); the work runs on the executors.
"""
from __future__ import annotations

import base64
import json
import pickle

from catalog import time_spans
from catalog.chunk import Chunk
from catalog.schema import TIME_NS_COLUMN, TableSchema
from server.views import ChunkSource, chunk_view_name, quote, spark_struct_for, table_view_sql

__all__ = ["table_deletes", "release_chunk_data", "release_df", "chunk_source_sql", "chunk_source", "merged_df", "register_df_chunk", "register_parquet_chunk", "estimate_bytes", "row_stats", "schema_bytes", "time_disjoint", "merged_spans",
           "PARQUET_SOURCE_NAME"]

PARQUET_SOURCE_NAME = "iox_parquet"


def estimate_bytes(rows: int, value_columns: int) -> int:
    """Bytes a chunk takes in Spark's block manager, roughly (8 bytes a value + row overhead)."""
    return rows * (8 * (value_columns + 2) + 16)


def time_disjoint(chunks: list) -> bool:
    """No two of `chunks` have rows at the same time (their time spans do not meet). Pure."""
    return time_spans.disjoint([time_spans.of_chunk(c) for c in chunks])


def merged_spans(chunks: list, lo: int | None = None, hi: int | None = None) -> tuple:
    """The time spans of the merge of `chunks` (of its rows within [lo, hi] when given). Pure."""
    spans = time_spans.union([time_spans.of_chunk(c) for c in chunks])
    return spans if lo is None or hi is None else time_spans.clip(spans, lo, hi)


def row_stats(df) -> dict:
    """{"n": rows, "lo": min time_ns, "hi": max time_ns} of a DataFrame in chunk layout (lo/hi None
    without rows). Runs one Spark job; called on the driver for a checkpointed chunk."""
    return df.selectExpr("count(*) AS n", f"min(`{TIME_NS_COLUMN}`) AS lo",
                         f"max(`{TIME_NS_COLUMN}`) AS hi").collect()[0].asDict()


def schema_bytes(rows: int, schema: TableSchema) -> int:
    """`estimate_bytes` of `rows` rows holding every value column of `schema`."""
    return estimate_bytes(rows, len([c for c in schema.columns if c.role != "time"]))


def chunk_source_sql(chunk: Chunk) -> str:
    return f"global_temp.{quote(chunk.view)}"


def chunk_source(chunk: Chunk) -> ChunkSource:
    """How views read `chunk` (its view must be registered)."""
    return ChunkSource(chunk_source_sql(chunk), chunk.column_names(), chunk.min_time_ns, chunk.max_time_ns,
                       chunk.deduplicated, chunk.time_spans)


def merged_df(spark, schema: TableSchema, chunks: list, deletes: list = (), extra_where: str = ""):
    """One deduplicated DataFrame (chunk layout) over `chunks`, in their order, with `deletes`
    materialised (the rows they remove are gone)."""
    sources = [chunk_source(c) for c in chunks]
    sql = table_view_sql(schema, sources, as_chunk=True, deletes=deletes)
    if extra_where:
        sql = f"SELECT * FROM ({sql}) WHERE {extra_where}"
    return spark.sql(sql)


def table_deletes(db, table: str) -> list:
    """The deletes that apply to `table` (its own, and database-wide ones via its Kafka partition)."""
    from server.write_buffer import partition_for

    return db.deletes.for_table(table, partition_for(table, db.kafka_partitions))


def register_df_chunk(df, chunk_id: int) -> str:
    """Registers an (already checkpointed) DataFrame as the chunk's view; returns the view name."""
    view = chunk_view_name(chunk_id)
    df.createOrReplaceGlobalTempView(view)
    return view


def register_parquet_chunk(spark, store, keys: list, schema_cols: list, chunk_id: int,
                           cache_dir: str | None = None) -> str:
    """Registers a view reading the chunk's Parquet files (an unloaded or not-yet-loaded chunk).

    Local store: Spark's native Parquet reader on the files themselves. S3 with a
    `cache_dir`: the files are copied once to that local directory and read natively
    too, so every Spark session (Spark Connect clients included) can read the view.
    S3 without a cache: the `iox_parquet` Python source (no hadoop-aws here), which a
    session must have registered.
    """
    view = chunk_view_name(chunk_id)
    from catalog.object_store import LocalObjectStore

    if isinstance(store, LocalObjectStore):
        df = spark.read.parquet(*[store.arrow_path(k) for k in keys])
    elif cache_dir is not None:
        df = spark.read.parquet(*[_cached_copy(store, k, cache_dir) for k in keys])
    else:
        struct = spark_struct_for(TableSchema("_", [_col(c) for c in schema_cols]))
        df = (spark.read.format(PARQUET_SOURCE_NAME).schema(struct)
              .option("store", base64.b64encode(pickle.dumps(store)).decode())
              .option("keys", json.dumps(keys)).load())
    df.createOrReplaceGlobalTempView(view)
    return view


def _cached_copy(store, key: str, cache_dir: str) -> str:
    """A local copy of an immutable object (Parquet files are never rewritten): fetched once."""
    import os

    path = os.path.join(cache_dir, *key.split("/"))
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(store.get(key))
        os.replace(tmp, path)
    return path


def release_chunk_data(spark, chunk: Chunk) -> None:
    """Drops a chunk's view and frees its checkpointed blocks (both forms). Driver only."""
    if chunk.view is not None:
        spark.catalog.dropGlobalTempView(chunk.view)
    release_df(chunk.df)
    for seg in chunk.segments:
        release_df(seg)


def release_df(df) -> None:
    """Frees the blocks of a locally checkpointed DataFrame (Dataset.unpersist does not reach them).

    `df` is the checkpoint itself, or a projection/filter of one (found below them): its
    checkpoint must back nothing else."""
    if df is None:
        return
    plan = df._jdf.queryExecution().analyzed()
    while not plan.getClass().getName().endswith("LogicalRDD") and plan.children().size() == 1:
        plan = plan.children().apply(0)
    if plan.getClass().getName().endswith("LogicalRDD"):
        plan.rdd().unpersist(False)
    else:
        df.unpersist()


def _col(c):
    from catalog.schema import Column

    return Column(*c) if not isinstance(c, Column) else c
