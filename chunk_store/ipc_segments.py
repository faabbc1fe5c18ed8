"""A chunk's write-buffer form: its rows as Arrow IPC streams held in Spark ("segments").

IOx keeps fresh writes in a write-optimised buffer (the MUB) and moves them to a
read-optimised one (the RUB) later. Here the write-optimised form is the write
buffer's own messages: each Kafka payload is already an Arrow IPC stream of one
table's rows, so a micro-batch becomes a chunk by copying those bytes into a
locally checkpointed DataFrame, with no per-row work in the JVM. A chunk's rows
are decoded where they are read (queries through the chunk's view, compaction,
persist), on the executors.

Layout of a segment (a checkpointed DataFrame of `SEGMENT_SCHEMA`, one row per
IPC stream, one Spark partition):
- `layout` WIRE: a write-buffer payload (the table's columns as the router
  wrote them, `time` int64 ns); row i of it has `_iox_seq` = `seq_base` + i.
  LAYOUT CHUNK: the chunk layout (value columns, `time_ns`, `_iox_seq`), as
  persist writes the rows it keeps in memory.
- `day_lo`/`day_hi`: the inclusive UTC day numbers of the rows this chunk takes
  from the stream, or NULL for all of them (a message spanning several days is
  in several day partitions).

Invariant: decoding a segment row yields exactly the rows its chunk holds, in
the chunk layout of the requested columns (a column the stream lacks is NULL,
a value of another type is cast, or NULL if it cannot be): the same rows the
chunk's view, compaction and persist see.

Runs on the driver (plans, view registration) and the executors (`decode_fn`,
`read_segment_rows`: picklable, plain data in their closures).
"""
from __future__ import annotations

from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN

__all__ = ["SEGMENT_SCHEMA", "SEGMENT_COLUMNS", "LAYOUT_WIRE", "LAYOUT_CHUNK", "decode_fn", "chunk_table",
           "segments_df", "register_segments_chunk", "value_columns_of", "value_arrays", "read_segment_rows",
           "arrow_type", "chunk_arrow_schema", "encode_ipc"]

SEGMENT_SCHEMA = "layout int, seq_base long, day_lo int, day_hi int, payload binary"
SEGMENT_COLUMNS = ["layout", "seq_base", "day_lo", "day_hi", "payload"]
#: a write-buffer payload: the router's columns, `time`, row i at seq_base + i
LAYOUT_WIRE = 0
#: the chunk layout: value columns, time_ns, _iox_seq
LAYOUT_CHUNK = 1


def arrow_type(typ: str):
    """Arrow type of a column type in the chunk layout (uinteger: decimal(20, 0), like Spark's)."""
    import pyarrow as pa

    return {"string": pa.string(), "float": pa.float64(), "integer": pa.int64(),
            "uinteger": pa.decimal128(20, 0), "boolean": pa.bool_()}[typ]


def chunk_arrow_schema(columns: list):
    """The Arrow schema of the chunk layout of `columns` [(name, type)]: them, `time_ns`, `_iox_seq`."""
    import pyarrow as pa

    return pa.schema([pa.field(n, arrow_type(t)) for n, t in columns]
                     + [pa.field(TIME_NS_COLUMN, pa.int64()), pa.field(SEQ_COLUMN, pa.int64())])


def value_arrays(t, columns: list, combine: bool = False) -> list:
    """The arrays of `columns` [(name, type)] of a decoded table `t` in the chunk layout's types: a
    column `t` lacks, or holds in a conflicting type (a foreign producer), reads as nulls.
    `combine`: plain Arrays (for a RecordBatch) instead of ChunkedArrays. Executor side."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = t.num_rows
    have = set(t.column_names)
    out = []
    for name, typ in columns:
        target = arrow_type(typ)
        if name in have:
            a = t.column(name)
            if combine:
                a = a.combine_chunks()
            if a.type != target:
                try:
                    a = pc.cast(a, target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    a = pa.nulls(n, target)  # a conflicting type from a foreign producer
        else:
            a = pa.nulls(n, target)
        out.append(a)
    return out


def value_columns_of(columns) -> list:
    """[(name, type)] of the value columns (tags and fields) of chunk columns [[name, role, type]]."""
    return [(c[0], c[2]) for c in columns if c[1] != "time"]


def chunk_table(t, layout: int, seq_base: int, day_lo, day_hi, columns: list):
    """One decoded IPC stream (`t`, a pyarrow Table) as a Table in the chunk layout of `columns`
    [(name, type)] + time_ns + _iox_seq, restricted to days [day_lo, day_hi] when given. Executor side."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = t.num_rows
    arrays = value_arrays(t, columns)
    names = [name for name, _typ in columns]
    if layout == LAYOUT_WIRE:
        time_ns = t.column("time")
        seq = pa.array(np.arange(n, dtype=np.int64) + seq_base)
    else:
        time_ns = t.column(TIME_NS_COLUMN)
        seq = t.column(SEQ_COLUMN)
    arrays += [time_ns, seq]
    names += [TIME_NS_COLUMN, SEQ_COLUMN]
    out = pa.Table.from_arrays(arrays, names=names)
    if day_lo is not None and n:
        from iox_spark.catalog.partition_keys import day_numbers

        d = day_numbers(out.column(TIME_NS_COLUMN).combine_chunks())
        out = out.filter(pc.and_(pc.greater_equal(d, day_lo), pc.less_equal(d, day_hi)))
    return out


def read_segment_rows(batches, columns: list, key_column: str | None = None):
    """Executor side: segment record batches -> chunk-layout Tables, one per IPC stream, in input order;
    with `key_column` (another column of the batches), (its value, Table) pairs."""
    import pyarrow as pa

    for b in batches:
        keys = b.column(key_column).to_pylist() if key_column else None
        layouts = b.column("layout").to_pylist()
        bases = b.column("seq_base").to_pylist()
        los = b.column("day_lo").to_pylist()
        his = b.column("day_hi").to_pylist()
        payloads = b.column("payload")
        for i in range(b.num_rows):
            t = chunk_table(pa.ipc.open_stream(payloads[i].as_buffer()).read_all(), layouts[i], bases[i], los[i],
                            his[i], columns)
            yield t if keys is None else (keys[i], t)


def decode_fn(columns: list):
    """The mapInArrow function of a chunk's view: segment rows -> chunk-layout record batches of
    `columns` [(name, type)]. Picklable (captures a list of pairs)."""

    def fn(batches):
        for t in read_segment_rows(batches, columns):
            yield from t.to_batches()

    return fn


def segments_df(segments: list):
    """One DataFrame over a chunk's segments (their union, in order)."""
    df = segments[0]
    for s in segments[1:]:
        df = df.union(s)
    return df


def register_segments_chunk(spark, segments: list, columns, chunk_id: int) -> str:
    """Registers the view of a chunk held as segments (`columns`: [[name, role, type]]) in `spark`'s
    session; returns its name.

    The view decodes the segments on the executors each time it is read.
    """
    from iox_spark.catalog.schema import TableSchema
    from iox_spark.chunk_store.cluster import task_slots
    from iox_spark.chunk_store.views import chunk_view_name, spark_struct_for

    schema = TableSchema.from_json("_", columns)
    df = segments_df(segments)
    # segments are one partition each: the view decodes them in at most one task per task slot
    slots = task_slots(df.sparkSession)
    if len(segments) > slots:
        df = df.coalesce(slots)
    from iox_spark.chunk_store import chunk_views

    return chunk_views.register(spark, chunk_view_name(chunk_id),
                                df.mapInArrow(decode_fn(value_columns_of(columns)), spark_struct_for(schema)))


def encode_ipc(table) -> bytes:
    """An Arrow table as IPC stream bytes (executor side)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()
