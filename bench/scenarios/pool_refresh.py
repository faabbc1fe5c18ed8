"""Scenario: what a pool member's refresh of a large pool catalog costs (docs/OPERATIONS.md, Sizing a
pool).

A pool catalog on a local object store holds `pool_refresh_files` Parquet files of another member
(10 tables) and `pool_refresh_deletes` delete predicates, each applying to every file of its table
(as a delete over persisted files does). This member (its own PreservedCatalog instance) has read
all of it. Measured, medians over `repeat` x 4 rounds, in this process:
- a refresh that finds nothing new (what every member does every 2 s per database);
- a refresh after the other member committed one file, plus this member taking the new state
  (`PoolControl.take_state`, which registers the new file for queries and drops nothing: the file's
  Spark view is left out here, as it costs the same whatever the catalog's size).
Target: each under 50 ms. No baseline: the figures are absolute.
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from types import SimpleNamespace

from bench.harness import Row

_DB = "bench_pool"
_TABLES = 10
_NOW_S = 1_700_000_000.0
_SCHEMA = [["host", "tag", "string"], ["v", "field", "float"], ["time", "time", "time"]]


def _catalogs(root: str, files: int, deletes: int):
    """(ours, theirs, the next file number): two members' instances of one pool catalog; theirs
    owns Kafka partition 1 and committed `files` files and `deletes` delete predicates."""
    from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
    from iox_spark.catalog.preserved_catalog import AddDeletePredicate, AddParquet, PreservedCatalog
    from iox_spark.catalog.sharding import partition_for

    store = LocalObjectStore(root)
    ours = PreservedCatalog.create_or_load(store, _DB, _NOW_S)[0]
    theirs = PreservedCatalog.create_or_load(store, _DB, _NOW_S)[0]
    ours.claim([0], 2, "ours", _NOW_S)
    theirs.claim([1], 2, "theirs", _NOW_S)
    tables = [t for t in (f"m{i}" for i in range(1000)) if partition_for(t, 2) == 1][:_TABLES]

    def add(i: int):
        t = tables[i % len(tables)]
        return AddParquet(key=parquet_key(_DB, t, "2026-01-01", f"00000000-0000-0000-0000-{i:012d}"), table=t,
                          partition_key="2026-01-01", row_count=1, size_bytes=1, min_time_ns=i, max_time_ns=i,
                          min_seq=i, max_seq=i, schema=_SCHEMA)

    per_txn = 500
    for lo in range(0, files, per_txn):
        theirs.commit([add(i) for i in range(lo, min(files, lo + per_txn))], _NOW_S)
    keys_of = {t: tuple(k for k, f in theirs.state.files.items() if f.table == t) for t in tables}
    for lo in range(0, deletes, per_txn // 10):
        theirs.commit([AddDeletePredicate(tables[i % len(tables)], 0, i + 1, (("host", "=", f"h{i}"),), files + i,
                                          keys_of[tables[i % len(tables)]])
                       for i in range(lo, min(deletes, lo + per_txn // 10))], _NOW_S)
    ours.refresh()
    return ours, theirs, add, files


def _member(db_state):
    """A PoolControl of member "ours" over a catalog holding the database, its parts stand-ins."""
    from iox_spark.catalog.catalog import Catalog
    from iox_spark.server.pool import membership
    from iox_spark.server.pool.membership import PoolControl

    catalog = Catalog(pool_member=True)
    db = catalog.ensure_database(_DB, f"iox.{_DB}", 2)
    db.own_only({0})
    names = ("write_buffer", "lifecycle", "consumer", "replay", "spark", "store", "parquet_cache",
             "query_engine", "visibility")
    pool = PoolControl("ours", catalog=catalog, ingestor=SimpleNamespace(refresh_table_view=lambda db, t: None),
                       partitions=2, auth_token=None, **dict.fromkeys(names))

    def register(spark, catalog_, store, db_, f, now, cache):  # the file's Spark view left out
        from iox_spark.catalog.chunk import Chunk

        catalog_.add_file(db_, f, Chunk(id=catalog_.next_chunk_id(), table=f.table, partition_key=f.partition_key,
                                        order=catalog_.next_order(), state="unloaded", rows=1, size_bytes=1,
                                        min_time_ns=0, max_time_ns=0, columns=[], view=None, parquet_keys=[f.key]))

    membership.register_persisted_file = register
    pool.take_state(_DB, db_state)
    return pool


def run(ctx) -> list[Row]:
    from iox_spark.server.pool import membership

    files, deletes = ctx.sizes["pool_refresh_files"], ctx.sizes["pool_refresh_deletes"]
    rounds = 4 * ctx.sizes["repeat"]
    root = tempfile.mkdtemp(prefix="pool-refresh-", dir=ctx.tmp)
    original = membership.register_persisted_file
    try:
        ours, theirs, add, n = _catalogs(root, files, deletes)
        pool = _member(ours.state)
        idle = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            ours.refresh()
            idle.append(time.perf_counter() - t0)
        news = []
        for i in range(rounds):
            theirs.commit([add(n + i)], _NOW_S)
            t0 = time.perf_counter()
            ours.refresh()
            pool.take_state(_DB, ours.state)
            news.append(time.perf_counter() - t0)
    finally:
        membership.register_persisted_file = original
        shutil.rmtree(root, ignore_errors=True)
    size = f"{files:,} files of 10 tables, {deletes:,} delete predicates over every file of their table"
    rows = [Row("pool catalog refresh, nothing new", "ms", statistics.median(idle) * 1000, target="<= 50 ms",
                size=size, better="lower"),
            Row("pool catalog refresh + take, one new file", "ms", statistics.median(news) * 1000,
                target="<= 50 ms", size=size, better="lower")]
    for r in rows:
        r.met = r.ours <= 50
    return rows
