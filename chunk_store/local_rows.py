"""Local chunks: a small write-buffer chunk's rows held on the driver, read without a Python worker.

A chunk's write-buffer form (chunk_store/ipc_segments.py) is decoded where it is
read: every query of its view runs a Python worker (`mapInArrow`) for it, and
under load that worker shares two cores with the micro-batches' own. For a
small table (a status or probe table written a few points at a time) those
round trips were most of a query's Spark time. So a micro-batch's messages of
one table that are all small become a *local* chunk instead: their payloads
reach the driver with the batch's metadata (which the consumer collects
anyway; server/consume/ingest.py), the chunk's segment is a local relation of those
payloads (no Spark job builds it: compaction and persist read it like any
other segment), and its rows, decoded on the driver by the same
`read_segment_rows` the executors run, are held in `Chunk.local_rows` and
registered as a local relation: its view runs no Python worker, and the query
engine merges a small table's local chunks with its tail rows in Arrow
(server/query/engine.py).

Invariant: a chunk's `local_rows` are exactly the rows its segments decode to,
in the chunk layout of its `columns` (value columns, `time_ns`, `_iox_seq`), in
write-buffer order; a chunk holds them only while it has at most
LOCAL_CHUNK_MAX_ROWS rows, and a chunk built from a micro-batch only when that
table's payloads in the batch were each at most LOCAL_PAYLOAD_MAX_BYTES and
together at most LOCAL_BUILD_MAX_BYTES.

Runs on the driver (the consumer's micro-batch thread, compaction, the query
engine); nothing here is pickled.
"""
from __future__ import annotations

from iox_spark.chunk_store.ipc_segments import (LAYOUT_CHUNK, SEGMENT_SCHEMA, chunk_arrow_schema, chunk_table, read_segment_rows,
                           value_columns_of)

__all__ = ["LOCAL_PAYLOAD_MAX_BYTES", "LOCAL_BUILD_MAX_BYTES", "LOCAL_CHUNK_MAX_ROWS", "segment_table",
           "local_segment_df", "decode_local", "conform", "local_df", "register_local_chunk", "joined_local_rows",
           "merged_local_rows", "merge_rows"]

#: a message's payload travels to the driver with the batch's metadata only up to this size
LOCAL_PAYLOAD_MAX_BYTES = 16 * 1024
#: a micro-batch's messages of one table make a local chunk only up to this many payload bytes
LOCAL_BUILD_MAX_BYTES = 256 * 1024
#: a chunk holds its rows on the driver only up to this many (a compaction joining local chunks
#: past it makes an ordinary write-buffer chunk)
LOCAL_CHUNK_MAX_ROWS = 20_000


def segment_table(rows: list):
    """Segment rows [(layout, seq_base, day_lo, day_hi, payload)] as a pyarrow Table of SEGMENT_SCHEMA."""
    import pyarrow as pa

    cols = list(zip(*rows)) if rows else [[], [], [], [], []]
    return pa.table({"layout": pa.array(cols[0], pa.int32()), "seq_base": pa.array(cols[1], pa.int64()),
                     "day_lo": pa.array(cols[2], pa.int32()), "day_hi": pa.array(cols[3], pa.int32()),
                     "payload": pa.array(cols[4], pa.binary())})


def local_segment_df(spark, segments):
    """A local chunk's segment: a local relation of `segments` (a `segment_table`). No job runs."""
    return spark.createDataFrame(segments, schema=SEGMENT_SCHEMA)


def decode_local(segments, columns: list):
    """The rows of `segments` (a `segment_table`) in the chunk layout of `columns` [[name, role,
    type]]: what the chunk's segment view decodes on the executors."""
    import pyarrow as pa

    value_cols = value_columns_of(columns)
    parts = list(read_segment_rows(segments.to_batches(), value_cols))
    if not parts:
        return chunk_arrow_schema(value_cols).empty_table()
    return pa.concat_tables(parts)


def conform(rows, columns: list):
    """Local rows in the chunk layout of `columns` [[name, role, type]] (a wider schema: columns
    they lack read as NULL, as a segment decoded with those columns would)."""
    return chunk_table(rows, LAYOUT_CHUNK, 0, None, None, value_columns_of(columns))


def local_df(spark, rows, columns: list):
    """A local relation of `rows` (a pyarrow Table in the chunk layout of `columns`). No job runs."""
    from iox_spark.catalog.schema import TableSchema
    from iox_spark.chunk_store.views import spark_struct_for

    return spark.createDataFrame(rows, schema=spark_struct_for(TableSchema.from_json("_", columns)))


def register_local_chunk(spark, rows, columns: list, chunk_id: int) -> str:
    """Registers a local chunk's view: a local relation of its `rows`. Returns the view name."""
    from iox_spark.chunk_store.views import chunk_view_name

    from iox_spark.chunk_store import chunk_views

    return chunk_views.register(spark, chunk_view_name(chunk_id), local_df(spark, rows, columns))


def merged_local_rows(chunks: list, schema, deletes: list):
    """(joined, merged) for a merge of local chunks on the driver (compaction into the read form):
    `joined` their `joined_local_rows`, `merged` those rows through `merge_rows` with the `deletes`
    (of the mailbox) that meet their time range, both in the chunk layout of `schema`. None when
    `joined_local_rows` is None or such a delete is not evaluable in Arrow. No Spark job runs."""
    import pyarrow.compute as pc

    from iox_spark.catalog.schema import TIME_NS_COLUMN

    joined = joined_local_rows(chunks, schema.to_json())
    if joined is None:
        return None
    mm = pc.min_max(joined.column(TIME_NS_COLUMN))
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    merged = merge_rows(joined, schema, [d for d in deletes
                                         if lo is not None and d.start_ns <= hi and d.stop_ns_exclusive > lo])
    return None if merged is None else (joined, merged)


def merge_rows(t, schema, deletes: list):
    """Rows `t` in the chunk layout of `schema` with `deletes` (of the mailbox) applied and
    deduplicated in Arrow (chunk_store/arrow_merge.py: the rows the SQL merge of the table views
    gives), or None when a delete is not evaluable in Arrow. Pure (driver: compaction of local
    chunks, the query engine's merge of a small table)."""
    from iox_spark.chunk_store.arrow_merge import apply_deletes, as_arrow_delete, deduplicate, deletes_supported

    col_types = {c.name: c.type for c in schema.columns if c.role != "time"}
    arrow_deletes = [as_arrow_delete(d) for d in deletes]
    if not deletes_supported(arrow_deletes, col_types):
        return None
    return deduplicate(apply_deletes(t, arrow_deletes, col_types), schema.tags(), [f.name for f in schema.fields()])


def joined_local_rows(chunks: list, columns: list):
    """The local rows of a join of `chunks` (in order) in the layout of `columns`, or None when one
    of them holds none or the join would pass LOCAL_CHUNK_MAX_ROWS."""
    import pyarrow as pa

    if not chunks or any(c.local_rows is None for c in chunks) \
            or sum(c.local_rows.num_rows for c in chunks) > LOCAL_CHUNK_MAX_ROWS:
        return None
    return pa.concat_tables([conform(c.local_rows, columns) for c in chunks])

