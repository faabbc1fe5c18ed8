"""Power-loss safety of the Parquet files persist and compaction write on a local object store:
each file, its directory and the parent of every directory created for it are fsync-ed by the task
that wrote it, before its metadata leaves the task and so before the preserved-catalog transaction
naming it is committed.

The executor sides run in this process (as Spark runs them in a Python worker); `os.fsync` and
`os.link` (how the local store creates a transaction file) are recorded in order."""
from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
from iox_spark.catalog.preserved_catalog import PreservedCatalog, RemoveParquet, SetTableSchema, transaction_key
from iox_spark.catalog.schema import TableSchema
from iox_spark.lifecycle.compact_persisted import arrow_compaction_fn
from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE
from iox_spark.lifecycle.persist import segments_persist_fn, writer_fn, add_parquet_action
from iox_spark.catalog.seq_layout import seq_base

DB, TABLE, PARTITION = "mydb", "cpu", "2024-01-01"
NOW_S = 1_700_000_000.0
_SCHEMA_JSON = [["host", "tag", "string"], ["v", "field", "float"], ["time", "time", "time"]]
_SEG = pa.schema([("ci", pa.int32()), ("layout", pa.int32()), ("seq_base", pa.int64()), ("day_lo", pa.int32()),
                  ("day_hi", pa.int32()), ("payload", pa.binary())])


class _Recorder:
    """Records ("fsync", path) for every `os.fsync` and ("link", target) for every `os.link`, in order."""

    def __init__(self, monkeypatch):
        self.events: list = []
        real_fsync, real_link = os.fsync, os.link

        def fsync(fd):
            path = os.readlink(f"/proc/self/fd/{fd}")
            real_fsync(fd)
            self.events.append(("fsync", path))

        def link(src, dst, *args, **kwargs):
            real_link(src, dst, *args, **kwargs)
            self.events.append(("link", os.fspath(dst)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "link", link)

    def synced(self, events=None) -> list:
        return [p for kind, p in (self.events if events is None else events) if kind == "fsync"]


@pytest.fixture
def root(tmp_path) -> str:
    return os.path.realpath(tmp_path / "objects")  # fsync paths are read back resolved


def _path(root: str, key: str) -> str:
    return os.path.join(root, *key.split("/"))


def _schema() -> TableSchema:
    return TableSchema.from_json(TABLE, _SCHEMA_JSON)


def _commit(cat: PreservedCatalog, metas: list, removed: tuple = ()) -> str:
    """Commits the files `metas` describe (and removes `removed`); returns the transaction's key."""
    schema = _schema()
    actions = [SetTableSchema(TABLE, tuple(tuple(c) for c in schema.to_json()))]
    actions += [add_parquet_action(m, TABLE, PARTITION, schema) for m in metas]
    actions += [RemoveParquet(k) for k in removed]
    return transaction_key(DB, cat.commit(actions, NOW_S))


def _assert_durable_before(rec: _Recorder, root: str, keys: list, events: list, commit_target: str | None,
                           created_dirs: bool = True) -> None:
    """Each file of `keys`, then its directory, and (`created_dirs`) the parents of the data
    directories created for it (the database's directory existed: the catalog lives there) are
    fsync-ed in `events`, before the link creating `commit_target` when one is given."""
    end = events.index(("link", commit_target)) if commit_target else len(events)
    synced = rec.synced(events[:end])
    for key in keys:
        path = _path(root, key)
        assert path in synced, f"{key} is not fsync-ed before the commit"
        assert os.path.dirname(path) in synced[synced.index(path) + 1:], f"the directory of {key} is not fsync-ed"
    if created_dirs:
        created_parents = {_path(root, p) for p in (DB, f"{DB}/data", f"{DB}/data/{TABLE}")}
        assert created_parents <= set(synced), "a directory created for the files is not durable before the commit"


def _chunk_batch(hosts: list, times: list, seqs: list) -> pa.RecordBatch:
    """Rows in the chunk layout (tags, fields, time_ns, _iox_seq)."""
    return pa.RecordBatch.from_pydict({"host": hosts, "v": [float(t) for t in times],
                                       "time_ns": pa.array(times, pa.int64()), "_iox_seq": pa.array(seqs, pa.int64())})


def test_a_file_written_by_write_one_file_is_durable_before_its_metadata_leaves_the_task_and_the_commit(
        root, monkeypatch):
    """`write_one_file`'s executor side: persist from the chunks' views and compaction by Spark."""
    store = LocalObjectStore(root)
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    rec = _Recorder(monkeypatch)
    key = parquet_key(DB, TABLE, PARTITION, uuid.uuid4())
    task = writer_fn(store, key)(iter([_chunk_batch(["a", "b"], [10, 20], [1, 2]),
                                        _chunk_batch(["c"], [30], [3])]))
    meta = next(task).to_pylist()[0]
    at_yield = list(rec.events)
    assert list(task) == []
    assert (meta["key"], meta["rows"]) == (key, 3)
    _assert_durable_before(rec, root, [key], at_yield, None)
    # one fsync per directory created (its parent), then the file, then its directory: no more
    path = _path(root, key)
    assert rec.synced(at_yield) == [_path(root, f"{DB}/data/{TABLE}"), _path(root, f"{DB}/data"), _path(root, DB),
                                    path, os.path.dirname(path)]
    txn = _commit(cat, [meta])
    _assert_durable_before(rec, root, [key], rec.events, _path(root, txn))
    assert pq.read_table(_path(root, key)).column("time_ns").to_pylist() == [10, 20, 30]


def _wire_rows(times_per_segment: list) -> pa.RecordBatch:
    def payload(hosts, times):
        t = pa.table({"host": hosts, "v": [float(x) for x in times], "time": pa.array(times, pa.int64())})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        return sink.getvalue().to_pybytes()

    rows = [dict(ci=0, layout=LAYOUT_WIRE, seq_base=seq_base(0, 1 + i), day_lo=None, day_hi=None,
                 payload=payload([f"h{j % 3}" for j in range(len(ts))], ts))
            for i, ts in enumerate(times_per_segment)]
    return pa.RecordBatch.from_pylist(rows, schema=_SEG)


@pytest.mark.parametrize("parallel_min_rows", [10, 10**6], ids=["two-files", "one-file"])
def test_files_a_persist_from_the_write_buffer_form_writes_are_durable_before_the_commit(
        root, monkeypatch, parallel_min_rows):
    """`segments_persist_fn` (persist's Arrow path, through `write_files`): every file it writes,
    also the files written in parallel, is durable when the task yields the first file's metadata."""
    store = LocalObjectStore(root)
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    rec = _Recorder(monkeypatch)
    keys = [parquet_key(DB, TABLE, PARTITION, uuid.uuid4()) for _ in range(2)]
    task = segments_persist_fn(store, keys, ["host"], [("v", "float")], 10**6, [], dedup=False,
                                parallel_min_rows=parallel_min_rows)(
        iter([_wire_rows([[30, 10, 20, 40, 50, 60], [15, 35, 55, 5, 25, 45]])]))
    first = next(task).to_pylist()[0]
    at_yield = list(rec.events)
    metas = [first] + [r for b in task for r in b.to_pylist()]
    files = [m for m in metas if m["kind"] == "file"]
    written = keys if parallel_min_rows == 10 else keys[:1]
    assert [m["key"] for m in files] == written and sum(m["rows"] for m in files) == 12
    _assert_durable_before(rec, root, written, at_yield, None)
    # the files share one directory: it is fsync-ed once, after both files
    assert rec.synced(at_yield).count(os.path.dirname(_path(root, keys[0]))) == 1
    txn = _commit(cat, files)
    _assert_durable_before(rec, root, written, rec.events, _path(root, txn))


def test_the_file_a_compaction_in_arrow_writes_is_durable_before_the_commit(root, monkeypatch):
    """`arrow_compaction_fn` (compaction's Arrow path, through `write_files`)."""
    store = LocalObjectStore(root)
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    old = [parquet_key(DB, TABLE, PARTITION, uuid.uuid4()) for _ in range(2)]
    for k, (times, seqs) in zip(old, [([10, 20], [1, 2]), ([20, 30], [3, 4])]):
        fs, path = store.arrow_prepare_write(k)
        pq.write_table(pa.Table.from_batches([_chunk_batch(["a"] * 2, times, seqs)]), path, filesystem=fs)
    _commit(cat, [{"key": k, "rows": 2, "size": 1, "min_t": 0, "max_t": 0, "min_seq": 0, "max_seq": 0} for k in old])
    rec = _Recorder(monkeypatch)
    key = parquet_key(DB, TABLE, PARTITION, uuid.uuid4())
    task = arrow_compaction_fn(store, old, key, [("host", "string"), ("v", "float")], ["host"], ["v"], [],
                                dedup=True)(iter([pa.RecordBatch.from_pylist([{"id": 0}])]))
    meta = next(task).to_pylist()[0]
    at_yield = list(rec.events)
    assert list(task) == []
    assert (meta["key"], meta["rows"]) == (key, 3)  # a@20 deduplicated
    # the partition's directory existed: only the new file and then that directory are fsync-ed
    path = _path(root, key)
    _assert_durable_before(rec, root, [key], at_yield, None, created_dirs=False)
    assert rec.synced(at_yield) == [path, os.path.dirname(path)]
    txn = _commit(cat, [meta], removed=tuple(old))
    _assert_durable_before(rec, root, [key], rec.events, _path(root, txn), created_dirs=False)
