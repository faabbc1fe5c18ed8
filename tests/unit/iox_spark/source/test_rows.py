"""What an input partition returns: a group of Parquet files merged as the table views merge chunks,
against a plain-Python oracle; the query layout Spark expects."""
from __future__ import annotations

import tempfile
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.chunk_store.arrow_merge import ArrowDelete
from iox_spark.source.errors import FileGone
from iox_spark.source.plan import FileRef, ReadPlan
from iox_spark.source.rows import query_arrow_schema, read_group, spark_schema

COLUMNS = (("host", "tag", "string"), ("n", "field", "integer"), ("v", "field", "float"), ("time", "time", "time"))
FIELDS = ("n", "v")


def _write(store, key, rows, columns=("host", "n", "v")):
    """A Parquet file in the chunk layout holding `rows` (dicts), only `columns` of the value columns."""
    types = {"host": pa.string(), "n": pa.int64(), "v": pa.float64(), "u": pa.decimal128(20, 0)}
    arrays = {c: pa.array([r.get(c) for r in rows], types[c]) for c in columns}
    arrays["time_ns"] = pa.array([r["time_ns"] for r in rows], pa.int64())
    arrays["_iox_seq"] = pa.array([r["seq"] for r in rows], pa.int64())
    fs, path = store.arrow_prepare_write(key)
    pq.write_table(pa.table(arrays), path, filesystem=fs)
    return FileRef(key, min(r["time_ns"] for r in rows), max(r["time_ns"] for r in rows))


def _plan(files, deletes=(), lo=None, columns=COLUMNS):
    return ReadPlan(database="db", table="cpu", revision=1, columns=columns, groups=(tuple(files),),
                    deletes=tuple(deletes), reader_lo_ns=lo)


def _oracle(files_rows, deletes, lo):
    """The rows a query of the table view gives: each delete removes the rows written before it in its
    range matching its terms (NULL never matches); then per (host, time) each field's last non-null
    value by seq."""
    def deleted(r):
        for d in deletes:
            if r["seq"] < d.seq and d.start_ns <= r["time_ns"] < d.stop_ns_exclusive and all(
                    r.get(c) is not None and ((r.get(c) == v) if op == "=" else (r.get(c) != v))
                    for c, op, v, _k in d.terms):
                return True
        return False

    kept = sorted((r for rows in files_rows for r in rows if not deleted(r)), key=lambda r: r["seq"])
    merged: dict = {}
    for r in kept:
        m = merged.setdefault((r.get("host"), r["time_ns"]), {"host": r.get("host"), "n": None, "v": None,
                                                              "time_ns": r["time_ns"]})
        for f in FIELDS:
            if r.get(f) is not None:
                m[f] = r[f]
    return sorted((m for m in merged.values() if lo is None or m["time_ns"] >= lo), key=_key)


def _key(r):
    return (r["host"] is None, r["host"] or "", r["time_ns"])


def _read(store, plan, batch_rows=3):
    batches = list(read_group(store, plan, plan.groups[0], batch_rows=batch_rows))
    assert all(0 < b.num_rows <= batch_rows for b in batches)
    assert all(b.schema == query_arrow_schema(plan) for b in batches)
    rows = [r for b in batches for r in b.to_pylist()]
    for r in rows:
        assert r.pop("time") == pa.scalar(r["time_ns"] // 1000, pa.timestamp("us", tz="UTC")).as_py()
    return sorted(rows, key=_key)


_row = st.fixed_dictionaries({"host": st.sampled_from(["a", "b", None]), "time_ns": st.integers(-3, 6),
                              "n": st.none() | st.integers(-2, 2), "v": st.none() | st.sampled_from([0.5, 1.5])})
_file_rows = st.lists(_row, min_size=1, max_size=8, unique_by=lambda r: (r["host"], r["time_ns"]))
_delete = st.builds(lambda lo, span, seq, terms: ArrowDelete(lo, lo + span, seq, tuple(terms)),
                    st.integers(-3, 6), st.integers(0, 5), st.integers(0, 30),
                    st.lists(st.sampled_from([("host", "=", "a", "string"), ("host", "!=", "b", "string"),
                                              ("n", "=", 1, "integer"), ("v", "!=", 0.5, "float"),
                                              ("gone", "=", "x", "string")]), max_size=2))


@settings(max_examples=60, deadline=None)
@given(st.lists(_file_rows, min_size=1, max_size=3), st.lists(_delete, max_size=3), st.none() | st.integers(-3, 6),
       st.randoms(use_true_random=False), st.booleans())
def test_a_group_reads_as_the_view_merge_of_its_files(files_rows, deletes, lo, rnd, drop_n):
    seqs = list(range(sum(len(rows) for rows in files_rows)))
    rnd.shuffle(seqs)  # write-buffer order across the files, any interleaving
    it = iter(seqs)
    files_rows = [[{**r, "seq": next(it)} for r in rows] for rows in files_rows]
    if drop_n:  # the first file was written before the table had `n`: it reads as NULL there
        files_rows[0] = [{**r, "n": None} for r in files_rows[0]]
    with tempfile.TemporaryDirectory() as d:
        store = LocalObjectStore(d)
        files = [_write(store, f"db/data/cpu/p/{i}.parquet", rows, ("host", "v") if drop_n and i == 0 else
                        ("host", "n", "v")) for i, rows in enumerate(files_rows)]
        assert _read(store, _plan(files, deletes, lo)) == _oracle(files_rows, deletes, lo)


def test_one_file_streams_with_deletes_and_the_query_layout(tmp_path):
    store = LocalObjectStore(tmp_path)
    cols = COLUMNS + (("u", "field", "uinteger"),)
    rows = [{"host": "a", "n": i, "v": None, "u": Decimal(2**64 - 1 - i), "time_ns": t, "seq": i}
            for i, t in enumerate([-1_500, -1, 0, 999, 1_000, 7_001])]
    f = _write(store, "db/data/cpu/p/one.parquet", rows, ("host", "n", "v", "u"))
    plan = _plan([f], [ArrowDelete(0, 1_000, 3, (("host", "=", "a", "string"),))], columns=cols)
    out = list(read_group(store, plan, plan.groups[0], batch_rows=2))
    t = pa.Table.from_batches(out)
    assert t.column_names == ["host", "n", "u", "v", "time", "time_ns"]
    # the delete takes the rows written before it in [0, 1000): seq 2 (t=0); seq 3 (t=999) is after it
    assert t.column("time_ns").to_pylist() == [-1_500, -1, 999, 1_000, 7_001]
    # time is floored to the microsecond, as the server's views compute it
    assert t.column("time").cast(pa.int64()).to_pylist() == [-2, -1, 0, 1, 7]
    assert t.column("u").to_pylist()[0] == Decimal(2**64 - 1)
    # the batches are what Spark's Python data source checks them against
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(spark_schema(plan), timezone="UTC") == query_arrow_schema(plan)
    # streamed: each 2-row batch of the file filtered on its own (the second lost its row at t=0)
    assert [b.num_rows for b in out] == [2, 1, 2]


def test_rows_older_than_reader_lo_are_not_returned_and_an_emptied_file_yields_nothing(tmp_path):
    store = LocalObjectStore(tmp_path)
    f = _write(store, "db/data/cpu/p/one.parquet", [{"host": "a", "n": 1, "time_ns": t, "seq": t} for t in (1, 2, 3)])
    assert [r["time_ns"] for r in _read(store, _plan([f], lo=2))] == [2, 3]
    assert list(read_group(store, _plan([f], lo=4), (f,))) == []


def test_a_file_cleanup_deleted_says_to_load_again(tmp_path):
    store = LocalObjectStore(tmp_path)
    f = _write(store, "db/data/cpu/p/one.parquet", [{"host": "a", "n": 1, "time_ns": 1, "seq": 1}])
    store.delete(f.key)
    with pytest.raises(FileGone, match="at catalog revision 1 is no longer in the object store.*load\\(\\) again") as e:
        list(read_group(store, _plan([f]), (f,)))
    assert e.value.key == f.key and isinstance(e.value.__cause__, OSError)
