"""chunk_store/parquet_cache.py: local copies bounded in bytes, removed only once no chunk reads them
and no query that may read them runs; a previous run's copies counted and swept."""
from __future__ import annotations

import os

import pytest

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.query_pins import QueryPins
from iox_spark.chunk_store import parquet_cache
from iox_spark.chunk_store.parquet_cache import CachedCopy, ParquetCache


@pytest.fixture
def store(tmp_path):
    s = LocalObjectStore(str(tmp_path / "store"))
    for i in range(4):
        s.put(f"db/data/t/p/{i}.parquet", bytes([i]) * 100)
    return s


def _key(i: int) -> str:
    return f"db/data/t/p/{i}.parquet"


def _removed(cache: ParquetCache, pins: QueryPins) -> list:
    out = []
    for obj in pins.take_unpinned():
        assert isinstance(obj, CachedCopy)
        cache.remove(obj)
        out.append(os.path.basename(obj.path))
    return sorted(out)


def test_copies_are_made_once_and_bounded_in_bytes(store, tmp_path):
    cache = ParquetCache(str(tmp_path / "cache"), 250, QueryPins())
    paths = cache.paths_for(store, [_key(0), _key(1)], [100, 100])
    assert [open(p, "rb").read() for p in paths] == [bytes([0]) * 100, bytes([1]) * 100]
    assert cache.bytes_held == 200
    assert cache.paths_for(store, [_key(0)]) == paths[:1]  # already there: no copy
    # 100 more would pass 250: nothing copied, the caller reads the object store
    assert cache.paths_for(store, [_key(2)], [100]) is None
    assert cache.bytes_held == 200 and not os.path.exists(cache.path_of(_key(2)))
    assert ParquetCache(str(tmp_path / "none"), 0, QueryPins()).paths_for(store, [_key(0)], [100]) is None


def test_a_copy_no_chunk_reads_goes_once_no_query_can_read_it(store, tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_cache, "_FRESH_S", 0.0)
    pins = QueryPins()
    cache = ParquetCache(str(tmp_path / "cache"), 1000, pins)
    p0, p1, p2 = cache.paths_for(store, [_key(0), _key(1), _key(2)])
    running = pins.pin()  # a query planned while chunks read copies 1 and 2
    assert cache.sweep({_key(0)}) == 2
    assert _removed(cache, pins) == [] and os.path.exists(p1) and os.path.exists(p2)
    assert cache.sweep({_key(0)}) == 0  # handed over once
    assert cache.paths_for(store, [_key(2)]) == [p2]  # asked for again meanwhile: it stays
    pins.unpin(running)
    assert _removed(cache, pins) == ["1.parquet", "2.parquet"]
    assert not os.path.exists(p1) and os.path.exists(p2) and os.path.exists(p0)
    assert cache.bytes_held == 200


def test_a_fresh_copy_stays_whatever_the_catalog_says(store, tmp_path):
    pins = QueryPins()
    cache = ParquetCache(str(tmp_path / "cache"), 1000, pins)
    cache.paths_for(store, [_key(0)])
    assert cache.sweep(set()) == 0 and _removed(cache, pins) == []


def test_a_previous_runs_copies_are_counted_and_swept_partial_ones_removed(store, tmp_path):
    first = ParquetCache(str(tmp_path / "cache"), 1000, QueryPins())
    p0, p1 = first.paths_for(store, [_key(0), _key(1)])
    partial = p1 + ".partial-1-2"
    open(partial, "wb").write(b"x")
    pins = QueryPins()
    again = ParquetCache(str(tmp_path / "cache"), 1000, pins)
    assert again.bytes_held == 200 and not os.path.exists(partial)
    assert again.sweep({_key(1)}) == 1  # not fresh: found at start
    assert _removed(again, pins) == ["0.parquet"] and again.bytes_held == 100


def test_a_missing_object_copies_nothing(store, tmp_path):
    from iox_spark.catalog.errors import ObjectNotFound

    cache = ParquetCache(str(tmp_path / "cache"), 1000, QueryPins())
    with pytest.raises(ObjectNotFound):
        cache.paths_for(store, ["db/data/t/p/missing.parquet"])
    assert cache.bytes_held == 0
    assert [f for _d, _s, fs in os.walk(cache.directory) for f in fs] == []
