"""lifecycle/iceberg_keys.py: which persisted files may share a (tags, time) key, on real Parquet files."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.preserved_catalog import AddParquet
from iox_spark.lifecycle.iceberg_keys import KeyOverlap

COLS = (("host", "tag", "string"), ("region", "tag", "string"), ("v", "field", "float"), ("time", "time", "time"))


def _file(store, key: str, rows: list, seq: int, columns=("host", "region")) -> AddParquet:
    """A Parquet file of `rows` [(host, region, time_ns)] holding only the tag `columns`."""
    data = {c: pa.array([r[i] for r in rows], pa.string()) for i, c in enumerate(("host", "region")) if c in columns}
    data["v"] = pa.array([1.0] * len(rows))
    data["time_ns"] = pa.array([r[2] for r in rows], pa.int64())
    data["_iox_seq"] = pa.array([seq] * len(rows), pa.int64())
    fs, path = store.arrow_prepare_write(key)
    pq.write_table(pa.table(data), path, filesystem=fs)
    store.arrow_finish_write([key])
    times = [r[2] for r in rows]
    return AddParquet(key=key, table="cpu", partition_key="d", row_count=len(rows), size_bytes=1,
                      min_time_ns=min(times), max_time_ns=max(times), min_seq=seq, max_seq=seq, schema=COLS)


def test_files_share_a_key_only_when_one_series_has_a_point_at_one_time_in_both(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    tags = ("region", "host")
    a = _file(store, "db/a.parquet", [(f"h{i}", "us", t) for i in range(50) for t in (10, 20, 30)], 1)
    b = _file(store, "db/b.parquet", [(f"h{i}", "us", t) for i in range(50) for t in (15, 25)], 2)  # same series, other times
    c = _file(store, "db/c.parquet", [(f"c.h{i}", "us", t) for i in range(50) for t in (10, 20, 30)], 3)  # other series
    d = _file(store, "db/d.parquet", [("h7", "us", 20)], 4)  # one point of a again
    e = _file(store, "db/e.parquet", [("h7", "eu", 20)], 5)  # another region: another series
    ko = KeyOverlap(store)
    assert ko.shares_keys(b, [a], tags) == set()
    assert ko.shares_keys(c, [a, b], tags) == set()
    assert ko.shares_keys(d, [a, b, c], tags) == {"db/a.parquet"}
    assert ko.shares_keys(e, [a, b, c, d], tags) == set()


def test_a_null_tag_and_a_missing_tag_column_are_the_same_key_and_an_empty_string_is_another(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    tags = ("host", "region")
    no_region = _file(store, "db/a.parquet", [("h1", None, 10), ("h2", None, 20)], 1, columns=("host",))
    null_region = _file(store, "db/b.parquet", [("h1", None, 10)], 2)
    empty_region = _file(store, "db/c.parquet", [("h2", "", 20)], 3)
    null_host = _file(store, "db/d.parquet", [(None, None, 10)], 4)
    ko = KeyOverlap(store)
    assert ko.shares_keys(null_region, [no_region], tags) == {"db/a.parquet"}
    assert ko.shares_keys(empty_region, [no_region, null_region], tags) == set()
    assert ko.shares_keys(null_host, [no_region, null_region, empty_region], tags) == set()


def test_answers_are_the_same_after_the_cache_evicted_and_after_forgetting(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    tags = ("host", "region")
    files = [_file(store, f"db/f{i}.parquet", [(f"h{j}", "r", 100 * i + j % 3) for j in range(i, i + 40)], i)
             for i in range(6)]
    files.append(_file(store, "db/x.parquet", [("h3", "r", 0), ("h44", "r", 502)], 9))  # f0's and f5's
    roomy, tight = KeyOverlap(store), KeyOverlap(store, cache_bytes=1)
    for ko in (roomy, tight):
        assert ko.shares_keys(files[-1], files[:-1], tags) == {"db/f0.parquet", "db/f5.parquet"}
    roomy.forget_except("db/", [f.key for f in files[1:]])
    assert roomy.shares_keys(files[-1], files[1:-1], tags) == {"db/f5.parquet"}
