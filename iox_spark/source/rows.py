"""The rows one input partition returns: a group of Parquet files, merged, in the query layout.

Invariant: :func:`read_group` returns exactly the rows the server's table view
gives for the group's files (chunk_store/arrow_merge.py does the merge the views do in
SQL): every recorded delete applied to the rows written before it, then one row
per (tags, time) with each field's last non-null value in write-buffer order (a
group of one file is already deduplicated: it is streamed batch by batch), no row
older than the plan's ``reader_lo_ns``; in the layout of the server's queries:
tags by name, fields by name, ``time`` (TIMESTAMP, microseconds, floored) and
``time_ns``. A column a file lacks reads as NULL.

Runs on the executors (called by `IoxDataSource`'s reader); reads the files with
pyarrow straight from the object store (a local directory, or S3 through
``pyarrow.fs.S3FileSystem`` with the store's endpoint and credentials), never
through the driver's disk.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iox_spark.catalog.object_store import ObjectStore
from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN
from iox_spark.chunk_store.arrow_merge import apply_deletes, deduplicate
from iox_spark.chunk_store.ipc_segments import LAYOUT_CHUNK, arrow_type, chunk_table

from iox_spark.source.errors import FileGone
from iox_spark.source.plan import OWNER_ROWS_KEY, FileRef, ReadPlan

__all__ = ["BATCH_ROWS", "TIME_COLUMN", "read_group", "query_arrow_schema", "spark_schema"]

#: rows per Arrow batch handed to Spark (and read from a file at a time)
BATCH_ROWS = 65_536
#: the timestamp column of the query layout (`time_ns` holds every digit)
TIME_COLUMN = "time"


def spark_schema(plan: ReadPlan):
    """The Spark StructType of the table as the server's queries present it."""
    from pyspark.sql import types as T

    spark = {"string": T.StringType(), "float": T.DoubleType(), "integer": T.LongType(),
             "uinteger": T.DecimalType(20, 0), "boolean": T.BooleanType()}
    fields = [T.StructField(n, spark[t], True) for n, t in plan.value_columns()]
    fields += [T.StructField(TIME_COLUMN, T.TimestampType(), True), T.StructField(TIME_NS_COLUMN, T.LongType(), True)]
    return T.StructType(fields)


def query_arrow_schema(plan: ReadPlan) -> pa.Schema:
    """The Arrow schema of the batches :func:`read_group` yields (Spark's Arrow form of
    :func:`spark_schema`)."""
    return pa.schema([pa.field(n, arrow_type(t)) for n, t in plan.value_columns()]
                     + [pa.field(TIME_COLUMN, pa.timestamp("us", tz="UTC")), pa.field(TIME_NS_COLUMN, pa.int64())])


def read_group(store: ObjectStore, plan: ReadPlan, group: tuple[FileRef, ...],
               batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The rows of `group` (files of `plan` whose times overlap) as record batches of
    :func:`query_arrow_schema`; no empty batch. Executor side."""
    out_schema = query_arrow_schema(plan)
    if len(group) == 1:
        for t in _file_tables(store, plan, group[0], batch_rows):
            yield from _query_batches(_filtered(t, plan), out_schema, batch_rows)
        return
    parts = [t for f in group for t in _file_tables(store, plan, f, batch_rows)]
    if not parts:
        return
    merged = pa.concat_tables(parts)
    merged = deduplicate(_filtered(merged, plan), plan.tags(), [n for n, _t in plan.fields()])
    yield from _query_batches(merged, out_schema, batch_rows)


def _file_tables(store: ObjectStore, plan: ReadPlan, f: FileRef, batch_rows: int) -> Iterator[pa.Table]:
    """The rows of file `f` in the chunk layout of the plan's columns, `batch_rows` at a time (the
    pseudo file OWNER_ROWS_KEY: the pool owner's unpersisted rows the plan carries)."""
    import pyarrow.parquet as pq

    if f.key == OWNER_ROWS_KEY:
        rows = pa.ipc.open_stream(pa.py_buffer(plan.owner_rows)).read_all()
        for off in range(0, rows.num_rows, batch_rows):
            yield chunk_table(rows.slice(off, batch_rows), LAYOUT_CHUNK, 0, None, None, plan.value_columns())
        return

    fs, _base = store.arrow_fs()
    try:
        pf = pq.ParquetFile(store.arrow_path(f.key), filesystem=fs)
    except OSError as exc:  # FileNotFoundError locally, OSError("Path does not exist") on S3
        if store.exists(f.key):
            raise
        raise FileGone(f.key, plan.database, plan.revision) from exc
    present = set(pf.schema_arrow.names)
    wanted = [n for n, _t in plan.value_columns() if n in present] + [TIME_NS_COLUMN, SEQ_COLUMN]
    for batch in pf.iter_batches(batch_size=batch_rows, columns=wanted):
        if batch.num_rows:
            yield chunk_table(pa.Table.from_batches([batch]), LAYOUT_CHUNK, 0, None, None, plan.value_columns())


def _filtered(t: pa.Table, plan: ReadPlan) -> pa.Table:
    """`t` without the rows a delete of the plan removes or older than its reader_lo_ns."""
    t = apply_deletes(t, plan.deletes, dict(plan.value_columns()))
    if plan.reader_lo_ns is not None and t.num_rows:
        t = t.filter(pc.greater_equal(t.column(TIME_NS_COLUMN), plan.reader_lo_ns))
    return t


def _query_batches(t: pa.Table, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Chunk-layout rows `t` in the query layout `schema`, as batches of at most `batch_rows`."""
    if not t.num_rows:
        return
    time_ns = t.column(TIME_NS_COLUMN).combine_chunks()
    micros = np.floor_divide(time_ns.to_numpy(zero_copy_only=False), 1000)
    arrays = [t.column(f.name) for f in schema if f.name not in (TIME_COLUMN, TIME_NS_COLUMN)]
    arrays += [pa.array(micros, pa.timestamp("us", tz="UTC")), time_ns]
    out = pa.Table.from_arrays(arrays, schema=schema)
    for batch in out.to_batches(max_chunksize=batch_rows):
        if batch.num_rows:
            yield batch
