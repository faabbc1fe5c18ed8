"""Tests of lifecycle/persist.py's executor side for the write-buffer form (`segments_persist_fn`):
which rows go to the Parquet file and which stay in memory, against a real local object store."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE
from iox_spark.lifecycle.persist import segments_persist_fn
from iox_spark.catalog.seq_layout import seq_base

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
    fn = segments_persist_fn(store, ["db/t/f.parquet", "db/t/g.parquet"], ["host"], [("v", "float")], flush_ts, [],
                              dedup=False)
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
    assert not (tmp_path / "db/t/g.parquet").exists()  # below parallel_min_rows: one file
    if in_memory:
        kept = pa.concat_tables([pa.ipc.open_stream(r["payload"]).read_all() for r in rems])
        assert kept.column("time_ns").to_pylist() == [10, 11, 12, 20, 21, 22][in_file:]


def _rows(times_per_segment: list) -> pa.RecordBatch:
    rows = [dict(ci=0, layout=LAYOUT_WIRE, seq_base=seq_base(0, 1 + i), day_lo=None, day_hi=None,
                 payload=_payload([f"h{j % 3}" for j in range(len(ts))], ts))
            for i, ts in enumerate(times_per_segment)]
    return pa.RecordBatch.from_pylist(rows, schema=_SEG)


def test_a_large_persist_writes_one_file_per_key_split_by_time(tmp_path):
    """From `parallel_min_rows` rows on, the rows are written as one file per key, each a time
    range of its own (they never meet), together exactly the rows, each file's stats its own."""
    store = LocalObjectStore(str(tmp_path))
    times = [[30, 10, 20, 40, 50, 60], [15, 35, 55, 5, 25, 45]]  # unordered, in two segments
    keys = ["db/t/a.parquet", "db/t/b.parquet"]
    fn = segments_persist_fn(store, keys, ["host"], [("v", "float")], 10**6, [], dedup=False, parallel_min_rows=10)
    out = [r for b in fn(iter([_rows(times)])) for r in b.to_pylist()]
    assert [r["kind"] for r in out] == ["file", "file"] and [r["key"] for r in out] == keys
    got = [sorted(pq.read_table(tmp_path / k).column("time_ns").to_pylist()) for k in keys]
    assert sorted(got[0] + got[1]) == sorted(times[0] + times[1])
    assert max(got[0]) < min(got[1]) and abs(len(got[0]) - len(got[1])) <= 2
    for r, g in zip(out, got):
        assert (r["rows"], r["min_t"], r["max_t"]) == (len(g), min(g), max(g))
        assert r["size"] == (tmp_path / r["key"]).stat().st_size and min(r["recv_s"], r["merge_s"], r["write_s"]) >= 0


def test_a_large_persist_of_one_time_writes_one_file(tmp_path):
    """Rows that all share one time cannot be split by time: one file, at the first key."""
    store = LocalObjectStore(str(tmp_path))
    fn = segments_persist_fn(store, ["db/t/a.parquet", "db/t/b.parquet"], ["host"], [("v", "float")], 10**6, [],
                              dedup=False, parallel_min_rows=10)
    out = [r for b in fn(iter([_rows([[7] * 6, [7] * 6])])) for r in b.to_pylist()]
    assert [(r["kind"], r["key"], r["rows"]) for r in out] == [("file", "db/t/a.parquet", 12)]
    assert not (tmp_path / "db/t/b.parquet").exists()


def test_time_pieces_keep_whole_the_batches_within_one_piece_and_cut_the_others():
    """Piece i holds cuts[i-1] < time <= cuts[i], in the table's order; a batch within one piece is
    the same batch (no copy), a batch across cuts is filtered into each piece it meets."""
    from iox_spark.lifecycle.persist import time_pieces

    def batch(times):
        return pa.record_batch({"v": pa.array([float(x) for x in times], pa.float64()),
                                "time_ns": pa.array(times, pa.int64())})

    batches = [batch([1, 2, 3]), batch([25, 21]), batch([4, 40, 10, 20, 11]), batch([]), batch([30, 35])]
    t = pa.Table.from_batches(batches)
    pieces = time_pieces(t, [10, 30])
    assert [p.column("time_ns").to_pylist() for p in pieces] == [[1, 2, 3, 4, 10], [25, 21, 20, 11, 30], [40, 35]]
    assert [p.column("v").to_pylist() for p in pieces] == [[1.0, 2.0, 3.0, 4.0, 10.0], [25.0, 21.0, 20.0, 11.0, 30.0],
                                                           [40.0, 35.0]]
    assert all(p.schema == t.schema for p in pieces)
    # the batches within one piece are passed on, not copied
    address = batches[0].column(1).buffers()[1].address
    assert pieces[0].column("time_ns").chunks[0].buffers()[1].address == address
    assert pieces[1].column("time_ns").chunks[0].buffers()[1].address == batches[1].column(1).buffers()[1].address


@pytest.mark.parametrize("slots, cores, rows, expected", [
    (2, 2, 10**9, 1),  # a local master: its one executor has every slot
    (8, 2, 10**9, 4),  # four executors of two cores
    (8, 2, 9, 2),  # rows for two tasks only
    (8, 2, 3, 1),
    (3, 4, 10**9, 1),  # an executor with more cores than the slots registered yet
])
def test_a_persist_runs_as_one_task_per_executor_with_enough_rows_for_each(slots, cores, rows, expected):
    from iox_spark.lifecycle.persist import persist_tasks

    assert persist_tasks(slots, cores, rows, min_rows_per_task=4) == expected


@given(lo=st.integers(-10**12, 10**12), span=st.integers(0, 10**6), tasks=st.integers(1, 12),
       times=st.lists(st.integers(-2 * 10**12, 2 * 10**12), max_size=30))
def test_persist_time_ranges_cover_every_time_once_in_order(lo, span, tasks, times):
    """Every time (inside the span or not) is in exactly one range; ranges are in time order, at most
    `tasks`, and as many as asked when the span allows the cuts."""
    from iox_spark.lifecycle.persist import persist_time_ranges

    ranges = persist_time_ranges(lo, lo + span, tasks)
    assert 1 <= len(ranges) <= tasks and ranges[0][0] is None and ranges[-1][1] is None
    if span >= tasks:
        assert len(ranges) == tasks
    for (_a, b), (c, _d) in zip(ranges, ranges[1:]):
        assert b == c and b is not None
    for t in times + [lo, lo + span, lo + span // 2]:
        assert sum(1 for a, b in ranges if (a is None or t > a) and (b is None or t <= b)) == 1


def test_each_task_of_a_persist_writes_and_keeps_only_its_time_range(tmp_path):
    """Run as several tasks, each task's function sees every input stream (with its task index)
    and writes only its range's rows, deduplicated and with the deletes applied, at its own keys;
    together the tasks write exactly what one task writes, in files whose times never meet, and keep
    exactly the rows after the flush timestamp."""
    from iox_spark.chunk_store.arrow_merge import ArrowDelete
    from iox_spark.lifecycle.persist import persist_time_ranges

    times = [[30, 10, 20, 40, 50, 60], [15, 35, 55, 5, 25, 45], [30, 10, 20, 40]]  # the third rewrites four
    # written before the third segment: takes 25, 35 and the first 30 (its rewrite stays)
    deletes = [ArrowDelete(24, 36, seq_base(0, 3), ())]

    def run(fn, task=None):
        b = _rows(times)
        if task is not None:
            b = b.append_column("task", pa.array([task] * b.num_rows, pa.int32()))
        return [r for x in fn(iter([b])) for r in x.to_pylist()]

    one = run(segments_persist_fn(LocalObjectStore(str(tmp_path / "one")), ["t/a.parquet"], ["host"],
                                   [("v", "float")], 50, deletes, dedup=True))
    ranges = persist_time_ranges(5, 50, 3)
    tasks = [(r, [f"t/{i}.parquet"]) for i, r in enumerate(ranges)]
    store = LocalObjectStore(str(tmp_path / "many"))
    fn = segments_persist_fn(store, ["unused"], ["host"], [("v", "float")], 50, deletes, dedup=True, tasks=tasks)
    many = [r for i in range(len(tasks)) for r in run(fn, i)]

    def file_rows(root, out):
        return sorted(row for r in out if r["kind"] == "file"
                      for row in zip(*pq.read_table(root / r["key"]).select(["host", "v", "time_ns"]).to_pydict().values()))

    assert [r["key"] for r in many if r["kind"] == "file"] == ["t/0.parquet", "t/1.parquet", "t/2.parquet"]
    assert file_rows(tmp_path / "many", many) == file_rows(tmp_path / "one", one)
    assert len(file_rows(tmp_path / "one", one)) == 8  # 12 series times, 2 deleted, 2 after the flush
    spans = [(r["min_t"], r["max_t"]) for r in many if r["kind"] == "file"]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))

    def kept(out):
        return sorted(t for r in out if r["kind"] == "rem"
                      for t in pa.ipc.open_stream(r["payload"]).read_all().column("time_ns").to_pylist())

    assert kept(many) == kept(one) == [55, 60]
