"""server/write/router.py `write_arrow`: a stream that Arrow reads but whose strings are not UTF-8
(a tag dictionary, a string field, a column name) is rejected whole with InvalidArgument, never an
internal error, and nothing is produced. A real Router and Catalog; the write buffer records what
would be produced."""
from __future__ import annotations

import pyarrow as pa
import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.errors import InvalidArgument
from iox_spark.server.write.router import ArrowTableWrite, Router
from tests.timestamps import T0


def _not_utf8(n: int) -> pa.Array:
    """n strings of the one byte 0x80 (not UTF-8), built from buffers as a stream would hold them."""
    offsets = pa.py_buffer(pa.array(list(range(n + 1)), pa.int32()).buffers()[1])
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(b"\x80" * n)])


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("where", ["tag dictionary", "tag", "string field"])
def test_strings_that_are_not_utf8_are_refused_whole(where, recording_buffer):
    n = 3
    time = pa.array([T0 + i for i in range(n)], pa.int64())
    bad = _not_utf8(n)
    if where == "tag dictionary":
        col = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), _not_utf8(1))
        roles = [("time", "time"), ("host", "tag"), ("v", "field")]
        table = pa.table({"time": time, "host": col, "v": pa.array([1.0] * n)})
    elif where == "tag":
        roles = [("time", "time"), ("host", "tag"), ("v", "field")]
        table = pa.table({"time": time, "host": bad, "v": pa.array([1.0] * n)})
    else:
        roles = [("time", "time"), ("s", "field")]
        table = pa.table({"time": time, "s": bad})
    buf = recording_buffer
    r = Router(Catalog(), buf, 2, 1 << 20)
    with pytest.raises(InvalidArgument, match="UTF-8|utf-8|UTF8"):
        r.write_arrow("db", [ArrowTableWrite("m", _ipc(table), roles)])
    assert buf.produced == []
