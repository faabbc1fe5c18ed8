"""chunk_store/ipc_segments.py: decoding a segment's IPC streams to the chunk layout (pure pyarrow)."""
from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from iox_spark.chunk_store.ipc_segments import LAYOUT_CHUNK, LAYOUT_WIRE, chunk_table, decode_fn, encode_ipc, value_columns_of
from iox_spark.catalog.seq_layout import seq_base
from iox_spark.catalog.partition_keys import NS_PER_DAY

COLUMNS = [("host", "string"), ("u", "uinteger"), ("v", "float"), ("extra", "boolean")]


def test_wire_payload_to_chunk_layout():
    wire = pa.table({"host": ["a", "b", None], "u": pa.array([1, 2**64 - 1, None], pa.uint64()),
                     "v": [1.5, None, 3.0], "time": pa.array([10, 11, 12], pa.int64())})
    base = seq_base(1, 42)
    t = chunk_table(wire, LAYOUT_WIRE, base, None, None, COLUMNS)
    assert t.column_names == ["host", "u", "v", "extra", "time_ns", "_iox_seq"]
    assert t.schema.field("u").type == pa.decimal128(20, 0)
    assert t.column("u").to_pylist() == [Decimal(1), Decimal(2**64 - 1), None]
    assert t.column("extra").to_pylist() == [None, None, None]  # a column the stream lacks is NULL
    assert t.column("time_ns").to_pylist() == [10, 11, 12]
    assert t.column("_iox_seq").to_pylist() == [base, base + 1, base + 2]


def test_conflicting_type_reads_as_null():
    wire = pa.table({"v": ["not a float"], "time": pa.array([1], pa.int64())})
    t = chunk_table(wire, LAYOUT_WIRE, 0, None, None, [("v", "float")])
    assert t.column("v").to_pylist() == [None]


def test_day_bounds_keep_only_that_day():
    times = [NS_PER_DAY - 1, NS_PER_DAY, 2 * NS_PER_DAY + 5, -1]
    wire = pa.table({"v": [1.0, 2.0, 3.0, 4.0], "time": pa.array(times, pa.int64())})
    t = chunk_table(wire, LAYOUT_WIRE, 100, 1, 1, [("v", "float")])
    assert t.column("time_ns").to_pylist() == [NS_PER_DAY]
    assert t.column("_iox_seq").to_pylist() == [101]  # a row keeps its position's seq
    t = chunk_table(wire, LAYOUT_WIRE, 100, -1, 0, [("v", "float")])
    assert t.column("time_ns").to_pylist() == [NS_PER_DAY - 1, -1]


def test_chunk_layout_passes_through_and_takes_new_columns():
    stored = pa.table({"host": ["a"], "time_ns": pa.array([5], pa.int64()), "_iox_seq": pa.array([77], pa.int64())})
    t = chunk_table(stored, LAYOUT_CHUNK, 0, None, None, [("host", "string"), ("later", "integer")])
    assert t.to_pylist() == [{"host": "a", "later": None, "time_ns": 5, "_iox_seq": 77}]


def test_decode_fn_reads_every_stream_of_a_segment_in_order():
    a = encode_ipc(pa.table({"v": [1.0, 2.0], "time": pa.array([1, 2], pa.int64())}))
    b = encode_ipc(pa.table({"v": [3.0], "time": pa.array([3], pa.int64())}))
    seg = pa.record_batch({"layout": pa.array([LAYOUT_WIRE, LAYOUT_WIRE], pa.int32()),
                           "seq_base": pa.array([seq_base(0, 1), seq_base(0, 2)], pa.int64()),
                           "day_lo": pa.array([None, None], pa.int32()), "day_hi": pa.array([None, None], pa.int32()),
                           "payload": pa.array([a, b], pa.binary())})
    out = pa.Table.from_batches(list(decode_fn([("v", "float")])(iter([seg]))))
    assert out.column("v").to_pylist() == [1.0, 2.0, 3.0]
    assert out.column("_iox_seq").to_pylist() == [seq_base(0, 1), seq_base(0, 1) + 1, seq_base(0, 2)]


def test_value_columns_of():
    assert value_columns_of([["h", "tag", "string"], ["f", "field", "float"], ["time", "time", "time"]]) == \
        [("h", "string"), ("f", "float")]
