"""Cleanup in an ingester pool, against a real local object store and no Spark: a member deletes the
unreferenced files of the tables of the Kafka partitions it owns (replaced by a compaction, left by a
commit refused after a claim) once they were unreferenced for the minimum age, and never a file of
another member's partition, one in flight, or one of a partition claimed away before the delete."""
from __future__ import annotations

import time

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.errors import PartitionsNotOwned
from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
from iox_spark.catalog.preserved_catalog import AddParquet, PreservedCatalog, RemoveParquet
from iox_spark.catalog.sharding import partition_for, topic_for
from iox_spark.lifecycle.rules import LifecycleRules
from iox_spark.lifecycle.worker import LifecycleWorker

DB = "pooled_db"
NOW_S = 1_700_000_000.0
MIN_AGE_S = 900.0
SCHEMA = [["host", "tag", "string"], ["usage", "field", "float"], ["time", "time", "time"]]
#: two Kafka partitions: this worker ("me") owns the first (table cpu), member "b" the second (table net)
PARTITIONS = 2
MINE, THEIRS = "cpu", "net"
assert partition_for(MINE, PARTITIONS) == 0 and partition_for(THEIRS, PARTITIONS) == 1


class _HookedStore(LocalObjectStore):
    """A local object store that runs `after_list` once after its next listing of data files."""

    after_list = None

    def list(self, prefix: str = ""):
        out = super().list(prefix)
        if "/data/" in prefix and self.after_list is not None:
            hook, self.after_list = self.after_list, None
            hook()
        return out


def _add(key: str, table: str) -> AddParquet:
    return AddParquet(key=key, table=table, partition_key="2024-01-01", row_count=1, size_bytes=4, min_time_ns=0,
                      max_time_ns=0, min_seq=0, max_seq=0, schema=SCHEMA)


def _file(store, table: str, name: str) -> str:
    key = parquet_key(DB, table, "2024-01-01", name)
    store.put(key, b"PAR1")
    return key


@pytest.fixture
def store(tmp_path) -> _HookedStore:
    return _HookedStore(str(tmp_path / "objects"))


@pytest.fixture
def worker(store, tmp_path):
    """A pool member's worker holding DB's preserved catalog; rounds an hour apart, so only what a
    test calls runs."""
    catalog = Catalog(pool_member=True)
    catalog.ensure_database(DB, topic_for(DB), PARTITIONS)
    preserved = {DB: PreservedCatalog.create_or_load(store, DB, NOW_S)[0]}
    w = LifecycleWorker(None, catalog, LifecycleRules(worker_backoff_ms=3_600_000), store, preserved,
                        str(tmp_path / "pause"))
    yield w
    w.stop()


@pytest.fixture
def member_b(store):
    """The other member's catalog instance of DB."""
    return PreservedCatalog.create_or_load(store, DB, NOW_S)[0]


def test_the_owner_deletes_its_unreferenced_files_after_the_minimum_age_and_nothing_else(store, worker,
                                                                                           member_b) -> None:
    mine = worker.preserved[DB]
    assert mine.claim([0], PARTITIONS, "me", NOW_S) == {0: 1}
    assert member_b.claim([1], PARTITIONS, "b", NOW_S) == {1: 1}
    live, replaced, orphan, in_flight = (_file(store, MINE, n) for n in ("live", "replaced", "orphan", "in-flight"))
    theirs_live, theirs_orphan = _file(store, THEIRS, "live"), _file(store, THEIRS, "orphan")
    mine.commit([_add(live, MINE), _add(replaced, MINE)], NOW_S)
    member_b.commit([_add(theirs_live, THEIRS)], NOW_S)
    mine.commit([RemoveParquet(key=replaced)], NOW_S)  # a compaction replaced it
    worker.in_flight.add([in_flight])

    first = time.time() + 10_000  # every file is past the minimum age by its store time
    assert worker.cleanup(first, MIN_AGE_S) == []  # found unreferenced now: another member may still read it
    assert worker.cleanup(first + MIN_AGE_S - 1, MIN_AGE_S) == []
    assert sorted(worker.cleanup(first + MIN_AGE_S, MIN_AGE_S)) == sorted([replaced, orphan])
    for key in (live, in_flight, theirs_live, theirs_orphan):
        assert store.exists(key), key
    assert not store.exists(replaced) and not store.exists(orphan)
    assert [t["writer"] for t in _writers(store)] == ["me", "b", "me", "b", "me"]


def _writers(store) -> list[dict]:
    import json

    from iox_spark.catalog.preserved_catalog import transaction_key

    out, revision = [], 1
    while store.exists(transaction_key(DB, revision)):
        out.append(json.loads(store.get(transaction_key(DB, revision))))
        revision += 1
    return out


def test_files_of_a_commit_refused_after_a_claim_are_deleted_by_the_new_owner(store, worker, member_b) -> None:
    assert member_b.claim([0, 1], PARTITIONS, "b", NOW_S) == {0: 1, 1: 1}
    written_by_b = _file(store, MINE, "b-persist")  # b persists ...
    assert worker.preserved[DB].claim([0], PARTITIONS, "me", NOW_S) == {0: 2}  # ... while this member takes over
    with pytest.raises(PartitionsNotOwned):
        member_b.commit([_add(written_by_b, MINE)], NOW_S)
    first = time.time() + 10_000
    assert worker.cleanup(first, MIN_AGE_S) == []
    assert worker.cleanup(first + MIN_AGE_S, MIN_AGE_S) == [written_by_b]
    assert not store.exists(written_by_b)


def test_a_member_deletes_nothing_of_a_partition_claimed_away_before_the_delete(store, worker, member_b) -> None:
    assert worker.preserved[DB].claim([0], PARTITIONS, "me", NOW_S) == {0: 1}
    orphan = _file(store, MINE, "orphan")
    first = time.time() + 10_000
    assert worker.cleanup(first, MIN_AGE_S) == []
    # b claims the partition between this member's listing and its deletes
    store.after_list = lambda: member_b.claim([0], PARTITIONS, "b", NOW_S)
    assert worker.cleanup(first + MIN_AGE_S, MIN_AGE_S) == []
    assert store.exists(orphan)
    assert worker.preserved[DB].owned_partitions == frozenset()
    assert worker.cleanup(first + 2 * MIN_AGE_S, MIN_AGE_S) == [] and store.exists(orphan)  # b's to delete now


def test_a_pool_member_deletes_nothing_before_any_claim(store, worker) -> None:
    orphan = _file(store, MINE, "orphan")
    first = time.time() + 10_000
    assert worker.cleanup(first, MIN_AGE_S) == [] and worker.cleanup(first + MIN_AGE_S, MIN_AGE_S) == []
    assert store.exists(orphan) and worker.fenced == {}
