"""server/write_buffer/wire_format.py: the per-day partition summary of a write's time column, and which
messages a reader skips as unreadable (header_problem, header_text)."""
import pyarrow as pa
import pytest

from iox_spark.catalog.schema import Column
from iox_spark.catalog.partition_keys import NS_PER_DAY, day_partitions
from iox_spark.server.write_buffer.wire_format import (as_part, encode_decision, encode_delete, encode_marker, encode_write, header_problem, header_text)


def _t(values):
    return pa.array(values, pa.int64())


def test_one_day_is_summarised_without_grouping():
    assert day_partitions(_t([5, 1, 3])) == {"1970-01-01": [3, 1, 5]}
    # negative times floor to the day before the epoch, also on its last nanosecond
    assert day_partitions(_t([-5, -1])) == {"1969-12-31": [2, -5, -1]}
    assert day_partitions(_t([NS_PER_DAY, 2 * NS_PER_DAY - 1])) == {"1970-01-02": [2, NS_PER_DAY, 2 * NS_PER_DAY - 1]}


def test_rows_over_several_days_are_counted_per_day():
    got = day_partitions(_t([-1, 0, NS_PER_DAY, NS_PER_DAY - 1, -NS_PER_DAY]))
    assert got == {"1969-12-31": [2, -NS_PER_DAY, -1], "1970-01-01": [2, 0, NS_PER_DAY - 1],
                   "1970-01-02": [1, NS_PER_DAY, NS_PER_DAY]}
    assert list(got) == sorted(got)


def test_no_rows_no_days():
    assert day_partitions(_t([])) == {}


_ORDER = ("iox-format", "iox-kind", "iox-table", "iox-schema", "iox-days", "iox-txn", "iox-txn-info")


def _problem(headers: list) -> str | None:
    h = dict(headers)
    return header_problem(*(header_text(h, k) for k in _ORDER))


def _write():
    data = pa.table({"host": ["a"], "v": pa.array([1.0]), "time": pa.array([5], pa.int64())})
    return encode_write("cpu", [Column("host", "tag", "string"), Column("v", "field", "float"),
                                Column("time", "time", "time")], data)


def test_every_message_the_server_writes_is_readable():
    w = _write()
    d = encode_delete("cpu", 0, 10, [["host", "=", "a", "string"]])
    for m in (w, d, as_part(w, "t1", 2), as_part(d, "t1", 2), encode_decision("t1", "commit", [[0, 4], [2, 7]], 2),
              encode_decision("t2", "abort", [], 1), encode_marker("t1", "commit", 0)):
        assert _problem(m.headers) is None, m.headers


@pytest.mark.parametrize("headers, reason", [
    ([], "no iox-format header"),
    ([("iox-kind", b"write")], "no iox-format header"),
    ([("iox-format", None), ("iox-kind", b"write")], "no iox-format header"),  # a null header is absent
    ([("iox-format", b"2"), ("iox-kind", b"upsert")], "unknown iox-kind 'upsert'"),
    ([("iox-format", b"2")], "unknown iox-kind ''"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-schema", b"[]"), ("iox-days", b"{}")],
     "write without iox-table"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b"not json")],
     "write with iox-schema 'not json'"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b'[["v","field","int"]]')],
     "write with iox-schema"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b'[["v","tag","float"]]')],
     "write with iox-schema"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b'[["v","field"]]')],
     "write with iox-schema"),
    # JSON lists where strings belong (unhashable: a set lookup would raise)
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b'[["v",["field"],"float"]]')],
     "write with iox-schema"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b'[["v","field",["float"]]]')],
     "write with iox-schema"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b"[]"),
      ("iox-days", b'{"2026-11-23": [1, 2]}')], "write with iox-days"),
    ([("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b"[]"),
      ("iox-days", b'{"2026-11-23": [1, 2, "3"]}')], "write with iox-days"),
    ([("iox-format", b"2"), ("iox-kind", b"part"), ("iox-txn", b"t"), ("iox-txn-info", b'{"q": 1}')],
     "part with iox-txn-info"),
    ([("iox-format", b"2"), ("iox-kind", b"part"), ("iox-txn-info", b'{"q": 1, "of": "write"}')],
     "part without iox-txn"),
    ([("iox-format", b"2"), ("iox-kind", b"decision"), ("iox-txn", b"t"),
      ("iox-txn-info", b'{"decision": "commit"}')], "decision with iox-txn-info"),
    ([("iox-format", b"2"), ("iox-kind", b"decision"), ("iox-txn", b"t"),
      ("iox-txn-info", b'{"decision": "commit", "parts": [[1]]}')], "decision with iox-txn-info"),
    ([("iox-format", b"2"), ("iox-kind", b"marker"), ("iox-txn", b"t"), ("iox-txn-info", b'{"decision": "maybe"}')],
     "marker with iox-txn-info"),
    ([("iox-format", b"2"), ("iox-kind", b"marker"), ("iox-txn", b"t"), ("iox-txn-info", b"\xff\xfe")],
     "marker without iox-txn or a JSON object"),
])
def test_headers_the_server_never_writes_name_their_problem(headers, reason):
    got = _problem(headers)
    assert got is not None and got.startswith(reason), got


def test_a_write_part_is_judged_as_the_write_it_holds():
    w = _write()
    bad = [(k, b"[[1, 2, 3]]" if k == "iox-schema" else v) for k, v in as_part(w, "t1", 2).headers]
    assert _problem(bad).startswith("write with iox-schema")


def test_header_text_never_raises():
    h = {"iox-kind": b"\xffwrite", "iox-table": None}
    assert header_text(h, "iox-kind") == "\ufffdwrite"
    assert header_text(h, "iox-table") == ""
    assert header_text(h, "iox-schema") == "[]"
    assert header_text(h, "iox-days") == "{}"
    assert header_text(h, "iox-rows") == "0"
