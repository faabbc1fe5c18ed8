"""Fencing in the lifecycle worker, against a real local object store and no Spark: the fence probe
finds a revision another writer committed without this worker committing anything, and a fenced
database is never committed to or cleaned up again while other databases go on."""
from __future__ import annotations

import dataclasses
import time

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.errors import RevisionConflict
from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
from iox_spark.catalog.preserved_catalog import AddParquet, PreservedCatalog
from iox_spark.lifecycle.hooks import LifecycleHooks
from iox_spark.lifecycle.rules import LifecycleRules
from iox_spark.lifecycle.worker import LifecycleWorker
from iox_spark.catalog.sharding import topic_for
from tests.waiting import wait_for

DB = "fenced_db"
OTHER = "other_db"
NOW_S = 1_700_000_000.0
SCHEMA = [["host", "tag", "string"], ["usage", "field", "float"], ["time", "time", "time"]]


def _add(key: str) -> AddParquet:
    return AddParquet(key=key, table="cpu", partition_key="2024-01-01", row_count=1, size_bytes=4, min_time_ns=0,
                      max_time_ns=0, min_seq=0, max_seq=0, schema=SCHEMA)


def _file(store, db: str, name: str) -> str:
    key = parquet_key(db, "cpu", "2024-01-01", name)
    store.put(key, b"PAR1")
    return key


@pytest.fixture
def store(tmp_path) -> LocalObjectStore:
    return LocalObjectStore(str(tmp_path / "objects"))


def _worker(store, tmp_path, pool_member: bool):
    """A worker holding the preserved catalogs of DB and OTHER (what recovery hands it); rounds an hour
    apart, so only what a test calls (or the fence probe) runs."""
    preserved = {name: PreservedCatalog.create_or_load(store, name, NOW_S)[0] for name in (DB, OTHER)}
    catalog = Catalog(pool_member=pool_member)
    for name in (DB, OTHER):
        catalog.ensure_database(name, topic_for(name), 1)
    calls = []
    w = LifecycleWorker(None, catalog, LifecycleRules(worker_backoff_ms=3_600_000), store, preserved,
                        str(tmp_path / "pause"), LifecycleHooks(on_fenced=calls.append))
    w.fenced_calls = calls
    return w


@pytest.fixture
def worker(store, tmp_path):
    w = _worker(store, tmp_path, pool_member=False)
    yield w
    w.stop()


@pytest.fixture
def pool_worker(store, tmp_path):
    """The same worker in a member of an ingester pool."""
    w = _worker(store, tmp_path, pool_member=True)
    yield w
    w.stop()


def _new_owner_commits(store, db: str, key: str) -> int:
    """Another server loads the catalog and commits a revision the worker never saw."""
    owner, _ = PreservedCatalog.create_or_load(store, db, NOW_S)
    return owner.commit([_add(key)], NOW_S)


def test_the_probe_fences_the_database_another_writer_committed_to(store, worker) -> None:
    assert worker.probe_fencing() == {} and worker.fenced == {}
    assert _new_owner_commits(store, DB, _file(store, DB, "theirs")) == 1
    assert worker.probe_fencing() == {DB: 1}
    assert worker.fenced == {DB: 1} and worker.fenced_revision(DB) == 1 and worker.fenced_revision(OTHER) is None
    [err] = worker.fenced_calls
    assert isinstance(err, RevisionConflict) and (err.db, err.revision) == (DB, 1)
    assert worker.probe_fencing() == {} and len(worker.fenced_calls) == 1  # reported once
    # nothing commits to it any more, before anything is written
    db = worker.catalog.database(DB)
    with pytest.raises(RevisionConflict):
        worker.record_database(db, NOW_S)
    with pytest.raises(RevisionConflict):
        worker.persist_now(db, None, None, NOW_S)
    assert worker.preserved[DB].revision == 0
    # the other database is still this worker's
    assert worker.record_database(worker.catalog.database(OTHER), NOW_S)
    assert worker.preserved[OTHER].revision == 1 and worker.probe_fencing() == {}


def test_a_pool_member_reads_another_members_first_claim_and_is_not_fenced(store, pool_worker) -> None:
    """A database no member claimed yet is a single committer's catalog; in a pool another
    member's first claim makes it a pool catalog: the probe reads it, never fences it."""
    states = []
    pool_worker.hooks = dataclasses.replace(
        pool_worker.hooks, on_catalog_refreshed=lambda name, state: states.append((name, state.revision, dict(state.owners))))
    other, _ = PreservedCatalog.create_or_load(store, DB, NOW_S)
    assert other.claim([0], 1, "other", NOW_S) == {0: 1}
    assert pool_worker.probe_fencing() == {} and pool_worker.fenced == {} and pool_worker.fenced_calls == []
    pc = pool_worker.preserved[DB]
    assert pc.state.pooled and pc.revision == 1 and pc.state.owners[0].owner == "other"
    assert (DB, 1) in [(n, r) for n, r, _o in states]


def test_a_pool_member_is_fenced_by_another_single_committer(store, pool_worker) -> None:
    assert _new_owner_commits(store, DB, _file(store, DB, "theirs")) == 1
    assert pool_worker.probe_fencing() == {DB: 1}
    assert pool_worker.fenced == {DB: 1} and len(pool_worker.fenced_calls) == 1 and pool_worker.preserved[DB].revision == 0


def test_the_probe_thread_notices_within_seconds_without_a_round(store, worker) -> None:
    worker.fence_probe_interval_s = 0.05
    worker.start()
    _new_owner_commits(store, DB, _file(store, DB, "theirs"))
    wait_for(lambda: worker.fenced, 5, "the fence probe to fence the database")
    assert worker.fenced == {DB: 1}
    assert worker.preserved[DB].revision == 0  # it committed nothing itself


def test_cleanup_deletes_none_of_the_new_owners_files(store, worker) -> None:
    theirs = _file(store, DB, "theirs")
    orphan = _file(store, DB, "orphan")
    other_orphan = _file(store, OTHER, "orphan")
    _new_owner_commits(store, DB, theirs)
    later = time.time() + 10_000  # every file is past the minimum age
    assert worker.cleanup(later, 900.0) == [other_orphan]  # the other database is cleaned up as before
    assert store.exists(theirs) and store.exists(orphan)
    assert worker.fenced == {DB: 1} and len(worker.fenced_calls) == 1
    assert worker.cleanup(later, 900.0) == []  # a fenced database is never cleaned up again
    assert store.exists(theirs) and store.exists(orphan)
