"""`read_state`: a reader's load of the preserved catalog as of any committed revision."""
from __future__ import annotations

import pytest

from iox_spark.catalog.object_store import LocalObjectStore, catalog_prefix, parquet_key
from iox_spark.catalog.preserved_catalog import (AddParquet, PreservedCatalog, PreservedCatalogConfig, RemoveParquet,
                                       checkpoint_key, read_state, transaction_key)

DB = "mydb"
NOW_S = 1_700_000_000.0
SCHEMA = [["host", "tag", "string"], ["time", "time", "time"]]


def _add(i: int) -> AddParquet:
    return AddParquet(key=parquet_key(DB, "cpu", "2024-01-01", f"f{i}"), table="cpu", partition_key="2024-01-01",
                      row_count=1, size_bytes=1, min_time_ns=i, max_time_ns=i, min_seq=i, max_seq=i, schema=SCHEMA)


class _RecordingStore(LocalObjectStore):
    def __init__(self, root) -> None:
        super().__init__(root)
        self.gets: list[str] = []

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)


def test_every_revision_reads_as_the_committer_had_it_from_the_newest_checkpoint_at_or_below_it(tmp_path):
    store = LocalObjectStore(tmp_path)
    cat, state = PreservedCatalog.create_or_load(store, DB, NOW_S, PreservedCatalogConfig(transactions_until_checkpoint=3))
    states = [state]
    for i in range(1, 8):
        cat.commit([_add(i)] + ([RemoveParquet(key=_add(i - 1).key)] if i % 2 == 0 else []), NOW_S + i)
        states.append(cat.state)
    assert sorted(m.key for m in store.list(catalog_prefix(DB)) if m.key.endswith(".ckpt")) == \
        [checkpoint_key(DB, 3), checkpoint_key(DB, 6)]
    recording = _RecordingStore(tmp_path)
    for r, expected in enumerate(states):
        assert read_state(store, DB, r) == expected
    recording.gets.clear()
    assert read_state(recording, DB, 5) == states[5]
    assert recording.gets == [checkpoint_key(DB, 3), transaction_key(DB, 4), transaction_key(DB, 5)]
    assert read_state(store, DB) == states[-1]
    # a revision past the newest reads the newest: the caller compares the revision
    assert read_state(store, DB, 99).revision == 7
    # nothing is written by a read
    assert len(store.list(catalog_prefix(DB))) == 8 + 2


def test_no_catalog_is_none_and_a_bad_revision_is_refused(tmp_path):
    store = LocalObjectStore(tmp_path)
    assert read_state(store, DB) is None
    assert store.list("") == []
    for bad in (-1, True, "3", 1.0):
        with pytest.raises(ValueError, match="revision must be an int"):
            read_state(store, DB, bad)
