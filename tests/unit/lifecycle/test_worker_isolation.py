"""One failing lifecycle action never stops the others: the worker's round (no Spark, a real local
object store) goes on with the next action, the next database and its housekeeping steps when one
of them raises, and records the failure."""
from __future__ import annotations

import pytest

import iox_spark.lifecycle.worker as worker_mod
from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.preserved_catalog import PreservedCatalog
from iox_spark.catalog.sharding import topic_for
from iox_spark.lifecycle.hooks import LifecycleHooks
from iox_spark.lifecycle.rules import LifecycleRules
from iox_spark.lifecycle.worker import LifecycleWorker

NOW_S = 1_700_000_000.0
DBS = ("db_a", "db_b")


@pytest.fixture
def worker(tmp_path):
    store = LocalObjectStore(str(tmp_path / "objects"))
    preserved = {name: PreservedCatalog.create_or_load(store, name, NOW_S)[0] for name in DBS}
    catalog = Catalog()
    for name in DBS:
        catalog.ensure_database(name, topic_for(name), 1)
    w = LifecycleWorker(None, catalog, LifecycleRules(worker_backoff_ms=3_600_000), store, preserved,
                        str(tmp_path / "pause"))
    yield w
    w.stop()


def test_a_failing_action_leaves_the_others_and_the_other_databases_running(worker, monkeypatch):
    monkeypatch.setattr(worker_mod, "decide", lambda state, rules, now: ["fails", "works"])
    done = []

    def execute(db, action, now):
        if action == "fails":
            raise RuntimeError(f"lost blocks of {db.name}")
        done.append((db.name, action))
        return True

    monkeypatch.setattr(worker, "execute", execute)
    assert worker.run_once(NOW_S) == ["works", "works"]
    assert sorted(done) == [("db_a", "works"), ("db_b", "works")]
    assert "lost blocks" in worker.last_error


def test_a_failing_housekeeping_step_leaves_the_later_ones_running(worker, monkeypatch):
    monkeypatch.setattr(worker_mod, "decide", lambda state, rules, now: [])
    ran = []

    def fail():
        raise OSError("store unreachable")

    monkeypatch.setattr(worker, "delete_unpinned_files", fail)
    monkeypatch.setattr(worker, "flush_mailboxes", lambda now: ran.append("flush"))
    monkeypatch.setattr(worker, "cleanup", lambda now, min_age_s: ran.append("cleanup"))
    worker._last_mailbox_flush = worker._last_cleanup = float("-inf")
    assert worker.run_once(NOW_S) == []
    assert ran == ["flush", "cleanup"] and "store unreachable" in worker.last_error


def test_a_prune_commits_outside_the_catalog_lock(worker, monkeypatch):
    """Retention drops a partition in one preserved-catalog transaction; while that object-store
    write takes its time (an S3 PUT with retries), micro-batches and queries still take the
    catalog's lock, and the partition is gone once it committed."""
    import threading

    db = worker.catalog.database("db_a")
    worker.catalog.partition(db, "cpu", "2020-01-01")
    worker.hooks = LifecycleHooks(refresh_view=lambda db, table: None)
    from iox_spark.catalog.preserved_catalog import AddParquet

    key = "db_a/data/cpu/2020-01-01/f.parquet"  # a file of the partition: the prune removes it
    worker.preserved["db_a"].commit([AddParquet(key=key, table="cpu", partition_key="2020-01-01", row_count=1,
                                                size_bytes=1, min_time_ns=0, max_time_ns=0, min_seq=0, max_seq=0,
                                                schema=(("v", "field", "float"), ("time", "time", "time")))], NOW_S)
    store = worker.store
    entered, release = threading.Event(), threading.Event()
    put = store.put_if_absent

    def slow_put(key, data):
        if "/catalog/" in key:
            entered.set()
            assert release.wait(30)
        return put(key, data)

    monkeypatch.setattr(store, "put_if_absent", slow_put)
    result = []
    t = threading.Thread(target=lambda: result.append(worker.prune_partition(db, "cpu", "2020-01-01", NOW_S)))
    t.start()
    try:
        assert entered.wait(30)
        read = threading.Thread(target=db.applied_offsets)  # an operation that takes the catalog's lock
        read.start()
        read.join(5)
        assert not read.is_alive()  # the lock is not held by the commit
        assert "2020-01-01" in db.partitions["cpu"]  # not dropped before it committed
    finally:
        release.set()
        t.join(30)
    assert result == [True] and "2020-01-01" not in db.partitions["cpu"]
    assert key not in worker.preserved["db_a"].state.files
