"""Tests of lifecycle/persist.py's executor side for the write-buffer form (`_segments_persist_fn`):
which rows go to the Parquet file and which stay in memory, against a real local object store."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.object_store import LocalObjectStore
from lifecycle.ipc_segments import LAYOUT_WIRE
from lifecycle.persist import _segments_persist_fn
from server.ingest import seq_base

_SEG = pa.schema([("ci", pa.int32()), ("layout", pa.int32()), ("seq_base", pa.int64()), ("day_lo", pa.int32()),
                  ("day_hi", pa.int32()), ("payload", pa.binary())])


def _payload(hosts: list, times: list) -> bytes:
    t = pa.table({"host": hosts, "v": [float(x) for x in range(len(hosts))], "time": pa.array(times, pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("flush_ts, in_file, in_memory", [(10**6, 6, 0), (0, 0, 6), (15, 3, 3)])
def test_rows_up_to_the_flush_timestamp_go_to_the_file_and_the_rest_stay(tmp_path, flush_ts, in_file, in_memory):
    store = LocalObjectStore(str(tmp_path))
    rows = [dict(ci=0, layout=LAYOUT_WIRE, seq_base=seq_base(0, 1), day_lo=None, day_hi=None,
                 payload=_payload(["a", "b", "c"], [10, 11, 12])),
            dict(ci=1, layout=LAYOUT_WIRE, seq_base=seq_base(0, 2), day_lo=None, day_hi=None,
                 payload=_payload(["a", "b", "c"], [20, 21, 22]))]
    fn = _segments_persist_fn(store, "db/t/f.parquet", ["host"], [("v", "float")], flush_ts, [], dedup=False)
    out = [r for b in fn(iter([pa.RecordBatch.from_pylist(rows, schema=_SEG)])) for r in b.to_pylist()]
    files = [r for r in out if r["kind"] == "file"]
    rems = [r for r in out if r["kind"] == "rem"]
    assert sum(r["rows"] for r in files) == in_file and sum(r["rows"] for r in rems) == in_memory
    if in_file:
        t = pq.read_table(tmp_path / "db/t/f.parquet")
        assert sorted(zip(t.column("host").to_pylist(), t.column("time_ns").to_pylist())) == \
            sorted(zip(["a", "b", "c", "a", "b", "c"][:in_file], [10, 11, 12, 20, 21, 22][:in_file]))
        assert (files[0]["min_t"], files[0]["max_t"]) == (10, [10, 11, 12, 20, 21, 22][in_file - 1])
    else:
        assert not (tmp_path / "db/t/f.parquet").exists()
    if in_memory:
        kept = pa.concat_tables([pa.ipc.open_stream(r["payload"]).read_all() for r in rems])
        assert kept.column("time_ns").to_pylist() == [10, 11, 12, 20, 21, 22][in_file:]
