"""Whether persisted files may hold the same (tags, time) key: the answer lifecycle/iceberg_plan.py asks.

Invariant kept here: :meth:`KeyOverlap.shares_keys` never leaves out a file that holds a (tags,
time) key the asking file holds (it may name one that holds none: a 64-bit hash collision, which
costs a merged copy, never a row). Two steps, so that the usual cases cost little:
1. each file's *series* (the hashes of its distinct tag sets) are read once and cached (bounded by
   ``SERIES_CACHE_BYTES``, a few bytes per series): files with no series in common share no key
   (new series, other hosts);
2. otherwise only the rows of the common series inside the two files' common time range are
   compared, by (series, time) hash (consecutive persists of the same series overlap in time by
   their late points only).
A pair's answer is kept while both files are published. A tag column a file lacks is null in each
of its rows, so files of older and newer schemas compare alike. The hashes depend on the files'
contents only (pandas' fixed-key hashing), so the same files always give the same answer, also
after a restart.

Driver only, from the publication's thread (not thread-safe); nothing here is picklable.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from iox_spark.catalog.object_store import ObjectStore
from iox_spark.catalog.preserved_catalog import AddParquet
from iox_spark.catalog.schema import TIME_NS_COLUMN

__all__ = ["SERIES_CACHE_BYTES", "KeyOverlap"]

#: bytes of series hashes kept in memory (8 per distinct tag set of a file); a file whose series were
#: pushed out is read again when needed
SERIES_CACHE_BYTES = 64 * 1024 * 1024
#: the hash of a null tag (of a row that has no value for the tag, or a file without the column)
_NULL_TAG = np.uint64(0x9E3779B97F4A7C15)


class KeyOverlap:
    """`SharesKeys` (lifecycle/iceberg_plan.py) over one object store's files (module docstring).
    ``tags``: the table's tag columns, in any order (the same for every file of the table); one
    instance serves every table (the tags are given per call)."""

    def __init__(self, store: ObjectStore, cache_bytes: int = SERIES_CACHE_BYTES) -> None:
        self._store = store
        self._cache_bytes = cache_bytes
        self._series: OrderedDict[tuple[str, tuple[str, ...]], np.ndarray] = OrderedDict()
        self._held_bytes = 0
        #: (key, earlier key) → whether they may share a key
        self._pairs: dict[tuple[str, str], bool] = {}

    def shares_keys(self, f: AddParquet, earlier: list[AddParquet], tags: tuple[str, ...]) -> set[str]:
        """The keys of the files of ``earlier`` that may hold a (tags, time) key ``f`` holds."""
        tags = tuple(sorted(tags))
        out: set[str] = set()
        mine = None  # f's (series, time) per row when read in this call: read at most once
        for g in earlier:
            pair = (f.key, g.key)
            known = self._pairs.get(pair)
            if known is None:
                f_series, f_rows = self._series_of(f.key, tags)
                mine = f_rows if f_rows is not None else mine
                g_series, theirs = self._series_of(g.key, tags)
                common = np.intersect1d(f_series, g_series, assume_unique=True)
                lo, hi = max(f.min_time_ns, g.min_time_ns), min(f.max_time_ns, g.max_time_ns)
                if not len(common) or lo > hi:
                    known = False
                else:
                    if mine is None:
                        mine = _read_rows(self._store, f.key, tags)
                    if theirs is None:
                        theirs = _read_rows(self._store, g.key, tags)
                    known = _intersect(_keys_within(mine, common, lo, hi), _keys_within(theirs, common, lo, hi))
                self._pairs[pair] = known
            if known:
                out.add(g.key)
        return out

    def forget_except(self, prefix: str, keys) -> None:
        """Drops what is known of the files under ``prefix`` (a database's) that are not in ``keys``."""
        keys = set(keys)

        def gone(k: str) -> bool:
            return k.startswith(prefix) and k not in keys

        self._pairs = {p: v for p, v in self._pairs.items() if not (gone(p[0]) or gone(p[1]))}
        for k in [k for k in self._series if gone(k[0])]:
            self._held_bytes -= self._series.pop(k).nbytes

    def _series_of(self, key: str, tags: tuple[str, ...]) -> tuple[np.ndarray, tuple | None]:
        """(the file's sorted series hashes, its `_read_rows` when they had to be read, else None)."""
        cached = self._series.get((key, tags))
        if cached is not None:
            self._series.move_to_end((key, tags))
            return cached, None
        rows = _read_rows(self._store, key, tags)
        series = np.unique(rows[0])
        self._series[(key, tags)] = series
        self._held_bytes += series.nbytes
        while self._held_bytes > self._cache_bytes and len(self._series) > 1:
            _k, old = self._series.popitem(last=False)
            self._held_bytes -= old.nbytes
        return series, rows


def _read_rows(store: ObjectStore, key: str, tags: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(series hash, time_ns) per row of the file ``key``: the series hash mixes its ``tags`` values
    (null for a column the file lacks)."""
    import pandas as pd
    import pyarrow.parquet as pq

    fs, _base = store.arrow_fs()
    path = store.arrow_path(key)
    names = set(pq.read_schema(path, filesystem=fs).names)
    present = [t for t in tags if t in names]
    table = pq.read_table(path, columns=present + [TIME_NS_COLUMN], filesystem=fs, read_dictionary=present)
    h = np.zeros(table.num_rows, dtype=np.uint64)
    for tag in tags:
        if tag in present:
            values = np.concatenate([_tag_hashes(chunk, pd) for chunk in table.column(tag).chunks]
                                    or [np.empty(0, dtype=np.uint64)])
        else:
            values = np.full(table.num_rows, _NULL_TAG, dtype=np.uint64)
        h = _mix(h ^ values)
    return h, table.column(TIME_NS_COLUMN).to_numpy()


def _keys_within(rows: tuple[np.ndarray, np.ndarray], series: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Sorted (series, time) hashes of the rows of ``series`` (sorted) whose time is in [lo, hi]."""
    h, t = rows
    keep = (t >= lo) & (t <= hi)
    h, t = h[keep], t[keep]
    at = np.searchsorted(series, h)
    keep = series[np.minimum(at, len(series) - 1)] == h
    keys = _mix(h[keep] ^ _mix(t[keep].astype(np.uint64)))
    keys.sort()
    return keys


def _intersect(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the sorted arrays ``a`` and ``b`` hold a common value."""
    if not len(a) or not len(b):
        return False
    if len(a) > len(b):
        a, b = b, a
    at = np.searchsorted(b, a)
    return bool(np.any(b[np.minimum(at, len(b) - 1)] == a))


def _tag_hashes(chunk, pd) -> np.ndarray:
    """A hash per row of one dictionary-encoded chunk of a tag column (``_NULL_TAG`` for a null):
    each distinct value is hashed once."""
    words = pd.util.hash_array(chunk.dictionary.to_numpy(zero_copy_only=False).astype(object))
    if not len(words):
        return np.full(len(chunk), _NULL_TAG, dtype=np.uint64)
    codes = chunk.indices.fill_null(0).to_numpy().astype(np.int64, copy=False)
    valid = chunk.is_valid().to_numpy(zero_copy_only=False)
    return np.where(valid, words[codes], _NULL_TAG).astype(np.uint64, copy=False)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (wrapping uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
