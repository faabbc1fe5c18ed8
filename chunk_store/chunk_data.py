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

from iox_spark.catalog import time_spans
from iox_spark.chunk_store import chunk_views
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.schema import TIME_NS_COLUMN, TableSchema
from iox_spark.chunk_store.cluster import parts_for, task_slots
from iox_spark.chunk_store.views import ChunkSource, chunk_view_name, quote, spark_struct_for, table_view_sql

__all__ = ["arrow_plan", "arrow_deletes_meeting", "indexed_segments_df", "merge_segment_rows", "time_part_mask",
           "time_range_mask",
           "arrow_merged_df", "arrow_merge_parts", "arrow_merge_relations", "ARROW_MERGE_MIN_ROWS",
           "release_chunk_data", "release_df", "chunk_source_sql", "chunk_source",
           "merged_df", "register_df_chunk", "register_parquet_chunk", "estimate_bytes", "row_stats", "schema_bytes",
           "time_disjoint", "merged_spans", "PARQUET_SOURCE_NAME"]

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
    """How SQL names the chunk's view: a temp view of the server's session (chunk_store/chunk_views.py)."""
    return quote(chunk.view)


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


def arrow_plan(chunks: list, schema, deletes: list):
    """(ArrowDelete list, whether to deduplicate) when `chunks` can be merged from their write-buffer
    form in Arrow (persist, the move to the read buffer): every chunk holds it and every delete term
    is evaluable in Arrow; else None. Deduplication is skipped when every chunk's streams are known
    to be deduplicated and no two chunks meet in time. Pure (driver)."""
    if not chunks or not all(c.segments for c in chunks):
        return None
    arrow_deletes = arrow_deletes_meeting(chunks, schema, deletes)
    if arrow_deletes is None:
        return None
    dedup = not (all(c.segments_deduplicated for c in chunks) and time_disjoint(chunks))
    return arrow_deletes, dedup


def arrow_deletes_meeting(chunks: list, schema, deletes: list) -> list | None:
    """The `deletes` (of the mailbox) whose time range meets `chunks`' (non-empty) as ArrowDelete,
    or None when Arrow cannot evaluate a term of one of them. Pure (driver)."""
    from iox_spark.chunk_store.arrow_merge import as_arrow_delete, deletes_supported

    col_types = {c.name: c.type for c in schema.columns if c.role != "time"}
    lo, hi = min(c.min_time_ns for c in chunks), max(c.max_time_ns for c in chunks)
    arrow_deletes = [as_arrow_delete(d) for d in deletes if d.start_ns <= hi and d.stop_ns_exclusive > lo]
    return arrow_deletes if deletes_supported(arrow_deletes, col_types) else None


def indexed_segments_df(chunks: list, segment_lists: list | None = None):
    """The union of the chunks' segments with each row's chunk index (column `ci`, chunk order), the
    input of `merge_segment_rows`; `segment_lists`: the chunks' segments as read earlier (default:
    read now). Driver side; no job runs."""
    from pyspark.sql import functions as F

    from iox_spark.chunk_store.ipc_segments import SEGMENT_COLUMNS

    inputs = None
    for i, segs in enumerate(segment_lists if segment_lists is not None else [c.segments for c in chunks]):
        for seg in segs:
            d = seg.select(F.lit(i).alias("ci"), *SEGMENT_COLUMNS)
            inputs = d if inputs is None else inputs.union(d)
    return inputs


#: Fibonacci hashing's multiplier (2^64 / golden ratio): consecutive and evenly spaced times spread
#: evenly over the parts
_TIME_HASH_MULTIPLIER = 0x9E3779B97F4A7C15


def time_part_mask(time_ns, part: int, parts: int):
    """Numpy bool mask of the rows of `time_ns` (an int64 Arrow array) that fall in part `part` of
    `parts`: a multiplicative hash of the time, so rows with the same time (every pair of rows
    deduplication may merge, whatever their tags) are in the same part. Pure (executor side)."""
    import numpy as np

    x = time_ns.to_numpy(zero_copy_only=False).view(np.uint64)
    return ((x * np.uint64(_TIME_HASH_MULTIPLIER)) >> np.uint64(32)) % np.uint64(parts) == part


def merge_segment_rows(batches, tags: list, fields: list, deletes: list, dedup: bool, part: tuple | None = None,
                       time_range: tuple | None = None):
    """Executor side, in ONE task: the rows of `indexed_segments_df` batches decoded in chunk order,
    `deletes` (ArrowDelete) applied, deduplicated when `dedup`: one pyarrow Table in the merged
    chunk layout (tags, fields, time_ns, _iox_seq; `tags` names, `fields` [(name, type)]), or None
    without rows. The same rows as `merged_df` of the same chunks and deletes; with `part` =
    (i, n), only those whose time is in part i of n (`time_part_mask`); with `time_range` =
    (after_exclusive, upto_inclusive) (None: unbounded on that side), only those with
    after_exclusive < time <= upto_inclusive. Parts of either kind together are the whole merge,
    since deduplication only merges rows of one time."""
    import pyarrow as pa

    from iox_spark.chunk_store.arrow_merge import apply_deletes, deduplicate
    from iox_spark.chunk_store.ipc_segments import chunk_arrow_schema, read_segment_rows

    columns = [(t, "string") for t in tags] + list(fields)
    target = chunk_arrow_schema(columns)
    parts = []
    for ci, t in read_segment_rows(batches, columns, key_column="ci"):
        if part is not None:
            t = t.filter(pa.array(time_part_mask(t.column(TIME_NS_COLUMN), *part)))
        if time_range is not None:
            t = _in_time_range(t, *time_range)
        parts.append((ci, t.cast(target)))
    if not parts:
        return None
    parts.sort(key=lambda p: p[0])  # stable: each chunk's streams keep their order
    t = pa.concat_tables([p for _ci, p in parts])
    del parts
    t = apply_deletes(t, deletes, dict(columns))
    if dedup:
        t = deduplicate(t, tags, [n for n, _t in fields])
    return t


def time_range_mask(times, after_exclusive: int | None, upto_inclusive: int | None):
    """Arrow bool mask of `times` with after_exclusive < time <= upto_inclusive (None: no bound on
    that side), or None when both are None (every row). Pure (executor side)."""
    import pyarrow.compute as pc

    mask = None
    if after_exclusive is not None:
        mask = pc.greater(times, after_exclusive)
    if upto_inclusive is not None:
        upto = pc.less_equal(times, upto_inclusive)
        mask = upto if mask is None else pc.and_(mask, upto)
    return mask


def _in_time_range(t, after_exclusive: int | None, upto_inclusive: int | None):
    """The rows of `t` (chunk layout) in `time_range_mask`'s range."""
    mask = time_range_mask(t.column(TIME_NS_COLUMN), after_exclusive, upto_inclusive)
    return t if mask is None else t.filter(mask)


def _merge_fn(tags: list, fields: list, deletes: list, dedup: bool, names: list, part: tuple | None = None):
    """mapInArrow function of `arrow_merged_df` (one task; `part` as `merge_segment_rows` takes
    it). Picklable (plain data)."""

    def fn(batches):
        import pyarrow as pa

        t = merge_segment_rows(batches, tags, fields, deletes, dedup, part)
        if t is not None:
            yield from t.select(names).combine_chunks().to_batches(max_chunksize=_MERGED_BATCH_ROWS)
            del t
        # the Python worker lives on (reused): hand the merge's memory back to the OS
        pa.default_memory_pool().release_unused()

    return fn


#: rows per Arrow batch `arrow_merged_df` hands Spark
_MERGED_BATCH_ROWS = 1 << 16


def arrow_merged_df(spark, schema: TableSchema, chunks: list, plan, deletes: list = (),
                    segment_lists: list | None = None, parts: int = 1):
    """`merged_df` of chunks that all hold the write-buffer form, computed in Arrow (`plan` from
    `arrow_plan(chunks, schema, deletes)`) instead of a Spark GROUP BY of every row: for 10M rows
    with one repeated point ~10 s instead of ~60 s on two busy cores. The same columns, types and
    rows as `merged_df`; `segment_lists` as `indexed_segments_df` takes it.

    `parts` tasks side by side (Spark partitions of the result; the session sets
    spark.sql.unionOutputPartitioning=false) each read every segment and keep the rows of one part
    of the time hash (`time_part_mask`), so a query of the result (a read-buffer chunk's
    checkpoint) runs on as many cores: for 10M rows on two cores a grouped aggregate ~0.5 s
    instead of ~1 s. Driver side; lazy (the caller checkpoints it)."""
    arrow_deletes, dedup = plan
    struct = merged_df(spark, schema, chunks, deletes).schema  # analysed only: the exact layout
    inputs = indexed_segments_df(chunks, segment_lists).coalesce(1)
    tags, fields = schema.tags(), [(f.name, f.type) for f in schema.fields()]
    out = None
    for i in range(parts):
        df = inputs.mapInArrow(_merge_fn(tags, fields, arrow_deletes, dedup, struct.fieldNames(),
                                         None if parts == 1 else (i, parts)), struct)
        out = df if out is None else out.union(df)
    return out


#: a group of overlapping write-buffer chunks of at least this many rows is merged for queries in
#: Arrow (`arrow_merge_relations`) instead of a Spark GROUP BY of every row
ARROW_MERGE_MIN_ROWS = 100_000
def arrow_merge_parts(chunks: list, slots: int) -> int:
    """`parts` of an `arrow_merged_df` of `chunks` that queries read: one per task slot of the
    application (`slots`: chunk_store/cluster.py `task_slots`) from ARROW_MERGE_MIN_ROWS rows on,
    else one. Pure."""
    return parts_for(slots) if sum(c.rows for c in chunks) >= ARROW_MERGE_MIN_ROWS else 1


def arrow_merge_relations(spark, schema: TableSchema, chunks: list, deletes: list):
    """The `merged_relation` of `chunk_store.views.table_view_sql` for a table view over `chunks`: a
    group of overlapping chunks that all hold the write-buffer form, of at least
    ARROW_MERGE_MIN_ROWS rows, whose deletes are evaluable in Arrow, reads a global temp view of
    its `arrow_merged_df` (computed by `arrow_merge_parts` tasks each time a query reads it: for
    10M rows with repeated keys seconds instead of a GROUP BY's tens of seconds on two cores);
    any other group returns None (merged by GROUP BY). The view is named for its chunks, recorded in
    each chunk's `merge_views` and dropped with the chunk's data. Driver side; no job runs."""
    import hashlib

    by_sql = {chunk_source_sql(c): c for c in chunks if c.view is not None}

    def relation(group: list):
        cs = [by_sql.get(src.sql) for src in group]
        if any(c is None for c in cs) or sum(c.rows for c in cs) < ARROW_MERGE_MIN_ROWS:
            return None
        # a compaction running beside this hands a chunk's segments to its replacement by
        # rebinding `segments` to []: the lists read once here are the ones the view reads (their
        # data lives on in the replacement, which a later refresh of the table view names)
        # (arrow_plan refuses chunks without segments)
        segment_lists = [c.segments for c in cs]
        plan = arrow_plan(cs, schema, deletes)
        if plan is None:
            return None
        # named for its chunks only: a new delete or column replaces the view in place, as it
        # replaces the table view (a query already planned keeps what it resolved)
        name = f"iox_merge_{hashlib.sha1(json.dumps([c.id for c in cs]).encode()).hexdigest()[:20]}"
        chunk_views.register(spark, name, arrow_merged_df(spark, schema, cs, plan, deletes, segment_lists,
                                                          arrow_merge_parts(cs, task_slots(spark))))
        for c in cs:
            c.add_merge_view(name)
        lo, hi = min(c.min_time_ns for c in cs), max(c.max_time_ns for c in cs)
        return ChunkSource(quote(name), {c.name for c in schema.columns if c.role != "time"},
                           lo, hi, True, merged_spans(cs, lo, hi))

    return relation


def register_df_chunk(spark, df, chunk_id: int) -> str:
    """Registers an (already checkpointed) DataFrame as the chunk's view in `spark`'s session;
    returns the view name."""
    return chunk_views.register(spark, chunk_view_name(chunk_id), df)


def register_parquet_chunk(spark, store, keys: list, schema_cols: list, chunk_id: int,
                           cache=None, sizes: list | None = None) -> str:
    """Registers a view reading the chunk's Parquet files (an unloaded or not-yet-loaded chunk).

    Local store: Spark's native Parquet reader on the files themselves (on a cluster
    only when it is a shared file system: server/config.py refuses it otherwise). S3
    with a `cache` (chunk_store/parquet_cache.py, local mode only): the files are copied
    to the local disk once and read natively too, as long as the copies fit its byte
    limit (`sizes`: the files' sizes when known). S3 otherwise (a cluster: executors on
    other hosts cannot read the driver's disk; a full cache): the `iox_parquet` Python
    source (no hadoop-aws here), its tasks reading S3 directly on the executors.
    """
    view = chunk_view_name(chunk_id)
    from iox_spark.catalog.object_store import LocalObjectStore

    # the files' columns are `schema_cols`: given, Spark does not read a footer to infer them
    # (the first persist of a server spent ~0.4 s there)
    struct = spark_struct_for(TableSchema("_", [_col(c) for c in schema_cols]))
    if isinstance(store, LocalObjectStore):
        df = spark.read.schema(struct).parquet(*[store.arrow_path(k) for k in keys])
    elif cache is not None and (paths := cache.paths_for(store, keys, sizes)) is not None:
        df = spark.read.schema(struct).parquet(*paths)
    else:
        # the columns as an option, not .schema(): the load resolves here (chunk_store/parquet_source.py)
        df = (spark.read.format(PARQUET_SOURCE_NAME).option("schema", struct.json())
              .option("store", base64.b64encode(pickle.dumps(store)).decode())
              .option("keys", json.dumps(keys)).load())
    return chunk_views.register(spark, view, df)


def release_chunk_data(spark, chunk: Chunk) -> None:
    """Drops a chunk's view (and the Arrow merge views it is part of) and frees its checkpointed
    blocks (both forms). Driver only."""
    if chunk.view is not None:
        chunk_views.drop(spark, chunk.view)
    for v in chunk.take_merge_views():
        chunk_views.drop(spark, v)
    release_df(chunk.df)
    for seg in chunk.segments:
        release_df(seg)
    chunk.release_local_rows()


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
    from iox_spark.catalog.schema import Column

    return Column(*c) if not isinstance(c, Column) else c
