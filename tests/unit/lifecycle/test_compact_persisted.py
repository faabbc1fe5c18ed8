"""Tests of lifecycle/compact_persisted.py's Arrow path: which compactions it takes (`stored_arrow_plan`)
and the executor side (`arrow_compaction_fn`) against a real local object store."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.schema import TableSchema
from iox_spark.lifecycle import compact_persisted
from iox_spark.chunk_store.arrow_merge import as_arrow_delete
from iox_spark.lifecycle.compact_persisted import arrow_compaction_fn, stored_arrow_plan

_COLUMNS = [("host", "string"), ("v", "float"), ("w", "integer")]


def _file(store, key: str, rows: list, columns=("host", "v", "w")) -> None:
    """A persisted file in the chunk layout: rows (host, v, w, time_ns, _iox_seq), `columns` only."""
    types = {"host": pa.string(), "v": pa.float64(), "w": pa.int64()}
    names = list(columns) + ["time_ns", "_iox_seq"]
    full = ["host", "v", "w", "time_ns", "_iox_seq"]
    data = {n: [r[full.index(n)] for r in rows] for n in names}
    t = pa.table({n: pa.array(data[n], types.get(n, pa.int64())) for n in names})
    fs, path = store.arrow_prepare_write(key)
    pq.write_table(t, path, filesystem=fs)


def _run(store, keys: list, deletes: list, dedup: bool) -> list:
    fn = arrow_compaction_fn(store, keys, "db/cpu/p/out.parquet", _COLUMNS, ["host"], ["v", "w"], deletes, dedup)
    return [r for b in fn(iter([pa.RecordBatch.from_pylist([{"id": 0}])])) for r in b.to_pylist()]


def test_files_merge_into_one_with_rewrites_deletes_and_a_column_a_file_lacks(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    # the first file predates column w
    _file(store, "db/cpu/p/1.parquet", [("a", 1.0, None, 10, 1), ("b", 2.0, None, 10, 2), ("a", 3.0, None, 20, 3)],
          columns=("host", "v"))
    # rewrites a@10 (w only: v stays 1.0) and b@10 (both), adds c@30
    _file(store, "db/cpu/p/2.parquet", [("a", None, 7, 10, 5), ("b", 9.0, 8, 10, 6), ("c", 4.0, 1, 30, 7)])
    # a delete written after seq 3 of host a in [20, 21): takes a@20 only; one after everything of host c
    deletes = [as_arrow_delete(Delete("cpu", 20, 21, (("host", "=", "a", "string"),), 4, 0)),
               as_arrow_delete(Delete("cpu", 0, 100, (("host", "=", "c", "string"),), 3, 0))]
    [meta] = _run(store, ["db/cpu/p/1.parquet", "db/cpu/p/2.parquet"], deletes, dedup=True)
    t = pq.read_table(tmp_path / "db/cpu/p/out.parquet")
    got = sorted(zip(*[t.column(n).to_pylist() for n in ("host", "v", "w", "time_ns", "_iox_seq")]))
    # c@30 (seq 7) was written after the delete of seq 3: it stays
    assert got == [("a", 1.0, 7, 10, 5), ("b", 9.0, 8, 10, 6), ("c", 4.0, 1, 30, 7)]
    assert t.schema.names == ["host", "v", "w", "time_ns", "_iox_seq"]
    assert (meta["key"], meta["rows"], meta["min_t"], meta["max_t"], meta["min_seq"], meta["max_seq"]) == \
        ("db/cpu/p/out.parquet", 3, 10, 30, 5, 7)
    assert meta["size"] == (tmp_path / "db/cpu/p/out.parquet").stat().st_size


def test_without_deduplication_every_row_is_kept(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    _file(store, "db/cpu/p/1.parquet", [("a", 1.0, 1, 10, 1), ("b", 2.0, 2, 11, 2)])
    _file(store, "db/cpu/p/2.parquet", [("a", 3.0, 3, 20, 3)])
    [meta] = _run(store, ["db/cpu/p/1.parquet", "db/cpu/p/2.parquet"], [], dedup=False)
    t = pq.read_table(tmp_path / "db/cpu/p/out.parquet")
    assert sorted(t.column("time_ns").to_pylist()) == [10, 11, 20] and meta["rows"] == 3


def test_when_every_row_is_deleted_no_file_is_written(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    _file(store, "db/cpu/p/1.parquet", [("a", 1.0, 1, 10, 1)])
    _file(store, "db/cpu/p/2.parquet", [("a", 2.0, 2, 10, 2)])
    deletes = [as_arrow_delete(Delete("cpu", 0, 100, (), 9, 0))]
    assert _run(store, ["db/cpu/p/1.parquet", "db/cpu/p/2.parquet"], deletes, dedup=True) == []
    assert not (tmp_path / "db/cpu/p/out.parquet").exists()


def test_a_column_of_a_conflicting_type_fails_instead_of_reading_as_null(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    t = pa.table({"host": ["a"], "v": ["not a float"], "w": [1], "time_ns": [10], "_iox_seq": [1]})
    fs, path = store.arrow_prepare_write("db/cpu/p/1.parquet")
    pq.write_table(t, path, filesystem=fs)
    with pytest.raises(pa.ArrowInvalid):
        _run(store, ["db/cpu/p/1.parquet"], [], dedup=True)


def _chunk(rows: int, lo: int, hi: int, deduplicated: bool = True):
    return SimpleNamespace(rows=rows, min_time_ns=lo, max_time_ns=hi, deduplicated=deduplicated,
                           time_spans=None)


def _schema() -> TableSchema:
    return TableSchema.from_json("cpu", [["host", "tag", "string"], ["v", "field", "float"],
                                         ["w", "field", "integer"], ["time", "time", "time"]])


def test_the_plan_deduplicates_only_files_that_meet_in_time_and_keeps_the_deletes_that_meet_them():
    s = _schema()
    d_in = Delete("cpu", 15, 25, (("host", "=", "a", "string"),), 9, 0)
    d_out = Delete("cpu", 100, 200, (), 9, 0)
    assert stored_arrow_plan([_chunk(5, 10, 19), _chunk(5, 20, 29)], s, [d_in, d_out]) == ([as_arrow_delete(d_in)], False)
    assert stored_arrow_plan([_chunk(5, 10, 20), _chunk(5, 20, 29)], s, []) == ([], True)
    assert stored_arrow_plan([_chunk(5, 10, 19), _chunk(5, 20, 29, deduplicated=False)], s, []) == ([], True)


def test_the_plan_leaves_to_spark_a_delete_arrow_cannot_evaluate_and_too_many_rows(monkeypatch):
    s = _schema()
    ranged = Delete("cpu", 0, 100, (("v", ">", "1", "float"),), 9, 0)
    assert stored_arrow_plan([_chunk(5, 10, 19), _chunk(5, 20, 29)], s, [ranged]) is None
    monkeypatch.setattr(compact_persisted, "ARROW_COMPACTION_MAX_ROWS", 9)
    assert stored_arrow_plan([_chunk(5, 10, 19), _chunk(5, 20, 29)], s, []) is None
    assert stored_arrow_plan([_chunk(5, 10, 19), _chunk(4, 20, 29)], s, []) == ([], False)
