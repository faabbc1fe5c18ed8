"""Cleanup on a local directory: it deletes nothing once another writer committed a revision newer
than the one it decided from (docs/ARCHITECTURE.md invariant 8), and its own later commits do not count."""

from __future__ import annotations

import time

import pytest

from iox_spark.catalog.cleanup import delete_unreferenced
from iox_spark.catalog.errors import RevisionConflict
from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
from iox_spark.catalog.preserved_catalog import AddParquet, PreservedCatalog, transaction_key

DB = "mydb"
NOW_S = 1_700_000_000.5
MIN_AGE_S = 900.0
SCHEMA = [["host", "tag", "string"], ["usage", "field", "float"], ["time", "time", "time"]]


def _add(key: str) -> AddParquet:
    return AddParquet(key=key, table="cpu", partition_key="2024-01-01", row_count=1, size_bytes=4, min_time_ns=0,
                      max_time_ns=0, min_seq=0, max_seq=0, schema=SCHEMA)


def _file(store: LocalObjectStore, name: str) -> str:
    key = parquet_key(DB, "cpu", "2024-01-01", name)
    store.put(key, b"PAR1")
    return key


@pytest.fixture
def store(tmp_path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


def _later() -> float:
    """A clock at which every file written by the test is older than MIN_AGE_S."""
    return time.time() + 2 * MIN_AGE_S


def test_a_newer_revision_of_another_writer_stops_cleanup_before_any_delete(store) -> None:
    stale, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    owner, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    orphan = _file(store, "orphan")
    theirs = _file(store, "theirs")
    assert owner.commit([_add(theirs)], now_s=NOW_S) == 1  # the stale writer never saw revision 1
    with pytest.raises(RevisionConflict) as info:
        delete_unreferenced(store, DB, stale.state, set(), MIN_AGE_S, _later(), newer_revision=stale.newer_revision)
    assert (info.value.db, info.value.revision, info.value.key) == (DB, 1, transaction_key(DB, 1))
    assert store.exists(theirs) and store.exists(orphan)  # nothing at all was deleted
    assert stale.fenced and stale.fenced_at == 1
    with pytest.raises(RevisionConflict):
        stale.commit([], now_s=NOW_S)


def test_without_a_probe_any_transaction_after_the_state_counts_as_another_writers(store) -> None:
    stale, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    owner, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    theirs = _file(store, "theirs")
    owner.commit([_add(theirs)], now_s=NOW_S)
    with pytest.raises(RevisionConflict) as info:
        delete_unreferenced(store, DB, stale.state, set(), MIN_AGE_S, _later())
    assert info.value.revision == 1
    assert store.exists(theirs)
    # the owner's own, newest state deletes what it does not reference
    orphan = _file(store, "orphan")
    assert delete_unreferenced(store, DB, owner.state, set(), MIN_AGE_S, _later()) == [orphan]
    assert store.exists(theirs) and not store.exists(orphan)


def test_own_commits_after_the_state_was_read_do_not_fence(store) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    orphan = _file(store, "orphan")
    in_flight = _file(store, "in-flight")
    state = cat.state  # read after the in-flight snapshot, as the ordering contract asks
    cat.commit([_add(in_flight)], now_s=NOW_S)  # this writer's own revision 1 lands meanwhile
    deleted = delete_unreferenced(store, DB, state, {in_flight}, MIN_AGE_S, _later(),
                                  newer_revision=cat.newer_revision)
    assert deleted == [orphan]
    assert store.exists(in_flight) and not cat.fenced
    assert cat.commit([], now_s=NOW_S) == 2


def test_nothing_to_delete_needs_no_probe(store) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    kept = _file(store, "kept")
    cat.commit([_add(kept)], now_s=NOW_S)

    def probe() -> int | None:
        raise AssertionError("probed with nothing to delete")

    assert delete_unreferenced(store, DB, cat.state, set(), MIN_AGE_S, _later(), newer_revision=probe) == []
    assert store.exists(kept)
