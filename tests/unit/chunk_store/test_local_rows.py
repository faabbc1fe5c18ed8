"""chunk_store/local_rows.py: a local chunk's segment and rows on the driver (pure pyarrow parts), and
which of a micro-batch's messages make a local chunk (server/consume/ingest.py `local_payloads`)."""
from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pyarrow as pa

from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE, decode_fn, encode_ipc
from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.schema import TableSchema
from iox_spark.chunk_store.local_rows import (LOCAL_BUILD_MAX_BYTES, LOCAL_CHUNK_MAX_ROWS, conform, decode_local,
                                  joined_local_rows, merged_local_rows, segment_table)
from iox_spark.server.consume.ingest import local_payloads
from iox_spark.catalog.seq_layout import seq_base
from iox_spark.catalog.partition_keys import NS_PER_DAY

COLUMNS = [["host", "tag", "string"], ["v", "field", "float"], ["u", "field", "uinteger"], ["time", "time", "integer"]]


def _payloads():
    a = encode_ipc(pa.table({"host": ["a", "b"], "v": [1.0, 2.0], "time": pa.array([1, NS_PER_DAY + 2], pa.int64())}))
    b = encode_ipc(pa.table({"host": ["a"], "u": pa.array([2**64 - 1], pa.uint64()),
                             "time": pa.array([3], pa.int64())}))
    return a, b


def test_decode_local_gives_the_rows_the_executors_decode():
    a, b = _payloads()
    for bounds in ((None, None), (0, 0), (1, 1)):
        seg = segment_table([(LAYOUT_WIRE, seq_base(2, 7), *bounds, a), (LAYOUT_WIRE, seq_base(2, 9), *bounds, b)])
        assert seg.schema.names == ["layout", "seq_base", "day_lo", "day_hi", "payload"]
        local = decode_local(seg, COLUMNS)
        executors = pa.Table.from_batches(list(decode_fn([("host", "string"), ("v", "float"), ("u", "uinteger")])(
            iter(seg.to_batches()))))
        assert local.to_pylist() == executors.to_pylist()
    seg = segment_table([(LAYOUT_WIRE, seq_base(2, 7), None, None, a), (LAYOUT_WIRE, seq_base(2, 9), None, None, b)])
    assert decode_local(seg, COLUMNS).to_pylist() == [
        {"host": "a", "v": 1.0, "u": None, "time_ns": 1, "_iox_seq": seq_base(2, 7)},
        {"host": "b", "v": 2.0, "u": None, "time_ns": NS_PER_DAY + 2, "_iox_seq": seq_base(2, 7) + 1},
        {"host": "a", "v": None, "u": Decimal(2**64 - 1), "time_ns": 3, "_iox_seq": seq_base(2, 9)}]


def test_decode_local_of_no_stream_is_an_empty_table_in_the_layout():
    t = decode_local(segment_table([]), COLUMNS)
    assert (t.num_rows, t.column_names) == (0, ["host", "v", "u", "time_ns", "_iox_seq"])
    assert t.schema.field("u").type == pa.decimal128(20, 0)


def test_conform_widens_to_a_later_schema():
    a, _b = _payloads()
    rows = decode_local(segment_table([(LAYOUT_WIRE, 100, None, None, a)]), [["host", "tag", "string"],
                                                                            ["v", "field", "float"]])
    wide = conform(rows, COLUMNS + [["ok", "field", "boolean"]])
    assert wide.column_names == ["host", "v", "u", "ok", "time_ns", "_iox_seq"]
    assert wide.to_pylist()[0] == {"host": "a", "v": 1.0, "u": None, "ok": None, "time_ns": 1, "_iox_seq": 100}


def test_joined_local_rows_keeps_chunk_order_and_refuses_a_chunk_without_local_rows_or_too_many_rows():
    a, b = _payloads()
    ra = decode_local(segment_table([(LAYOUT_WIRE, 10, None, None, a)]), [["host", "tag", "string"],
                                                                         ["v", "field", "float"]])
    rb = decode_local(segment_table([(LAYOUT_WIRE, 20, None, None, b)]), COLUMNS)
    ca, cb = SimpleNamespace(local_rows=ra, rows=2), SimpleNamespace(local_rows=rb, rows=1)
    joined = joined_local_rows([ca, cb], COLUMNS)
    assert joined.column("_iox_seq").to_pylist() == [10, 11, 20]
    assert joined.column("u").to_pylist() == [None, None, Decimal(2**64 - 1)]
    assert joined_local_rows([ca, SimpleNamespace(local_rows=None, rows=1)], COLUMNS) is None
    # bounded by the rows held (a read-form chunk's `rows` count its merge, fewer)
    many = rb.take([0] * LOCAL_CHUNK_MAX_ROWS)
    assert joined_local_rows([ca, SimpleNamespace(local_rows=many, rows=1)], COLUMNS) is None
    assert joined_local_rows([SimpleNamespace(local_rows=many, rows=1)], COLUMNS).num_rows == LOCAL_CHUNK_MAX_ROWS
    assert joined_local_rows([], COLUMNS) is None


def test_merged_local_rows_apply_the_deletes_and_deduplicate_on_the_driver():
    """The read form of a merge of local chunks: the joined rows kept as they are, the merge with a
    delete applied (only to rows written before it) and a rewritten point merged field by field."""
    a, b = _payloads()
    ra = decode_local(segment_table([(LAYOUT_WIRE, 10, None, None, a)]), COLUMNS)
    rb = decode_local(segment_table([(LAYOUT_WIRE, 20, None, None, b)]), COLUMNS)
    chunks = [SimpleNamespace(local_rows=ra, rows=2), SimpleNamespace(local_rows=rb, rows=1)]
    schema = TableSchema.from_json("cpu", COLUMNS)
    # a delete of host b (seq 15: after chunk a's rows) and one after every row that meets nothing
    deletes = [Delete("cpu", 0, NS_PER_DAY * 2, (("host", "=", "b", "string"),), 15, 0),
               Delete("cpu", 0, NS_PER_DAY * 2, (("host", "=", "a", "string"),), 5, 0)]
    joined, merged = merged_local_rows(chunks, schema, deletes)
    assert joined.to_pylist() == joined_local_rows(chunks, COLUMNS).to_pylist()
    assert sorted(merged.to_pylist(), key=lambda r: r["time_ns"]) == [
        {"host": "a", "v": 1.0, "u": None, "time_ns": 1, "_iox_seq": 10},
        {"host": "a", "v": None, "u": Decimal(2**64 - 1), "time_ns": 3, "_iox_seq": 20}]
    # a rewrite of a point: one row, each field its last value
    rc = decode_local(segment_table([(LAYOUT_WIRE, 30, None, None, encode_ipc(pa.table(
        {"host": ["a"], "u": pa.array([7], pa.uint64()), "time": pa.array([1], pa.int64())})))]), COLUMNS)
    _, merged = merged_local_rows(chunks + [SimpleNamespace(local_rows=rc, rows=1)], schema, [])
    assert sorted(merged.to_pylist(), key=lambda r: (r["time_ns"], r["host"])) == [
        {"host": "a", "v": 1.0, "u": Decimal(7), "time_ns": 1, "_iox_seq": 30},
        {"host": "a", "v": None, "u": Decimal(2**64 - 1), "time_ns": 3, "_iox_seq": 20},
        {"host": "b", "v": 2.0, "u": None, "time_ns": NS_PER_DAY + 2, "_iox_seq": 11}]
    # refused: a delete Arrow does not evaluate (a comparison of a float with a string), a chunk
    # that is not local, too many rows
    assert merged_local_rows(chunks, schema, [Delete("cpu", 0, 10, (("v", "=", "x", "string"),), 99, 0)]) is None
    assert merged_local_rows(chunks + [SimpleNamespace(local_rows=None, rows=1)], schema, []) is None
    many = SimpleNamespace(local_rows=rb.take([0] * LOCAL_CHUNK_MAX_ROWS), rows=1)
    assert merged_local_rows(chunks + [many], schema, []) is None


def _msg(offset, payload, kind="write", nrows=1):
    return {"offset": offset, "kind": kind, "nrows": nrows,
            "small_payload": bytearray(payload) if payload is not None else None}


def test_a_batchs_small_plain_writes_make_a_local_chunk_in_offset_order():
    assert local_payloads([_msg(9, b"x"), _msg(4, b"yy")]) == [(4, b"yy"), (9, b"x")]


def test_a_large_payload_a_transaction_part_too_many_bytes_or_rows_make_an_ordinary_chunk():
    assert local_payloads([_msg(1, b"x"), _msg(2, None)]) is None  # its payload was too large to come along
    assert local_payloads([_msg(1, b"x"), _msg(2, b"y", kind="part")]) is None
    half = b"z" * (LOCAL_BUILD_MAX_BYTES // 2 + 1)
    assert local_payloads([_msg(1, half), _msg(2, half)]) is None
    assert local_payloads([_msg(1, half)]) == [(1, half)]
    rows = LOCAL_CHUNK_MAX_ROWS // 2
    assert local_payloads([_msg(1, b"x", nrows=rows), _msg(2, b"y", nrows=rows)]) == [(1, b"x"), (2, b"y")]
    assert local_payloads([_msg(1, b"x", nrows=rows), _msg(2, b"y", nrows=rows + 1)]) is None
