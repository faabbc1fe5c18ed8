"""Tests of chunk_store/chunk_data.py's split of an Arrow merge into parts (`time_part_mask`,
`merge_segment_rows(part=...)`): the parts together are exactly the whole merge, whatever the
repeated keys, because rows of one time are always in the same part."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from iox_spark.chunk_store.chunk_data import merge_segment_rows, time_part_mask
from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE
from iox_spark.catalog.seq_layout import seq_base

_SEG = pa.schema([("ci", pa.int32()), ("layout", pa.int32()), ("seq_base", pa.int64()), ("day_lo", pa.int32()),
                  ("day_hi", pa.int32()), ("payload", pa.binary())])
_SECOND = 1_000_000_000


def _payload(hosts: list, values: list, times: list) -> bytes:
    t = pa.table({"host": hosts, "v": pa.array(values, pa.float64()), "time": pa.array(times, pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("step_ns", [1, _SECOND, 10 * _SECOND])
def test_every_time_is_in_exactly_one_part_and_the_parts_are_balanced(parts, step_ns):
    times = pa.array(1_700_000_000 * _SECOND + np.arange(30_000, dtype=np.int64) * step_ns)
    masks = [time_part_mask(times, i, parts) for i in range(parts)]
    assert (sum(m.astype(int) for m in masks) == 1).all()
    for m in masks:  # evenly spaced times (seconds, 10 s: all even) spread over the parts
        assert abs(int(m.sum()) - 30_000 // parts) < 30_000 // parts // 10


def test_the_same_time_is_in_the_same_part():
    times = pa.array([5, 7, 5, 9, 7, 5], pa.int64())
    for i in range(2):
        m = time_part_mask(times, i, 2)
        assert m[0] == m[2] == m[5] and m[1] == m[4]


@pytest.mark.parametrize("parts", [2, 3])
def test_the_parts_of_a_merge_are_exactly_the_whole_merge(parts):
    """Two chunks rewriting each other's keys (host, time): deduplication picks the last value
    within each part as it does over all rows."""
    rng = np.random.default_rng(7)
    rows = []
    for ci in range(2):
        for r in range(3):
            n = 400
            hosts = [f"h{x}" for x in rng.integers(0, 5, n)]
            times = (rng.integers(0, 300, n) * _SECOND).tolist()
            rows.append(dict(ci=ci, layout=LAYOUT_WIRE, seq_base=seq_base(0, 1 + ci * 3 + r), day_lo=None,
                             day_hi=None, payload=_payload(hosts, rng.random(n).tolist(), times)))
    batch = pa.RecordBatch.from_pylist(rows, schema=_SEG)

    def merged(part):
        t = merge_segment_rows(iter([batch]), ["host"], [("v", "float")], [], True, part)
        return sorted(t.to_pylist(), key=lambda r: (r["host"], r["time_ns"]))

    whole = merged(None)
    assert len(whole) == len({(r["host"], r["time_ns"]) for r in whole}) < 2400  # 2,400 rows written: keys repeat
    pieces = [merged((i, parts)) for i in range(parts)]
    assert all(pieces) and sorted((r for p in pieces for r in p), key=lambda r: (r["host"], r["time_ns"])) == whole
