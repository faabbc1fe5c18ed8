"""Object store, preserved-catalog fencing, Parquet via pyarrow and cleanup on both backends.

Every test runs against a local directory and against S3 on a real
``moto_server`` process (fixture in ``tests/integration/s3_fixture.py``).
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import time
import uuid

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_spark.catalog.cleanup import delete_unreferenced, find_unreferenced
from iox_spark.catalog.errors import AlreadyExists, InvalidKey, ObjectNotFound, RevisionConflict
from iox_spark.catalog.object_store import (
    LocalObjectStore,
    ObjectStore,
    S3Config,
    S3ObjectStore,
    object_store_from_url,
    parquet_key,
)
from iox_spark.catalog.preserved_catalog import (
    AddParquet,
    PreservedCatalog,
    PreservedCatalogConfig,
    transaction_key,
)
from tests.integration.s3_fixture import (  # noqa: F401
    MOTO_ACCESS_KEY_ID,
    MOTO_REGION,
    MOTO_SECRET_ACCESS_KEY,
    moto_s3,
)

DB = "mydb"
NOW_S = 1_700_000_000.0
RACE_ROUNDS = 20
BACKENDS = ["local", "s3"]


def _s3_store(endpoint: str, prefix: str = "tenant-a/objects") -> S3ObjectStore:
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=MOTO_ACCESS_KEY_ID,
        aws_secret_access_key=MOTO_SECRET_ACCESS_KEY,
        region_name=MOTO_REGION,
    ).create_bucket(Bucket=bucket)
    return S3ObjectStore(
        S3Config(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=endpoint,
            region=MOTO_REGION,
            access_key_id=MOTO_ACCESS_KEY_ID,
            secret_access_key=MOTO_SECRET_ACCESS_KEY,
        )
    )


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path) -> ObjectStore:
    if request.param == "local":
        return LocalObjectStore(tmp_path / "objects")
    return _s3_store(request.getfixturevalue("moto_s3"))


def _add(key: str, i: int = 1) -> AddParquet:
    return AddParquet(
        key=key,
        table="cpu",
        partition_key="2024-01-01",
        row_count=i,
        size_bytes=100,
        min_time_ns=0,
        max_time_ns=i,
        min_seq=0,
        max_seq=i,
        schema=[["host", "tag", "string"], ["time", "time", "time"]],
    )


# --------------------------------------------------------------------------- basic object operations


def test_put_get_exists_list_delete(store: ObjectStore) -> None:
    assert store.list("") == []
    store.put("a/b/one", b"1")
    store.put("a/bc/two", b"22")
    store.put("a/b/three", b"333")
    store.put("z", b"")
    assert store.get("a/b/one") == b"1" and store.get("z") == b""
    store.put("a/b/one", b"one again")  # overwrite
    assert store.get("a/b/one") == b"one again"
    assert store.exists("a/b/one") and not store.exists("a/b/missing") and not store.exists("a/b")

    metas = store.list("")
    assert [m.key for m in metas] == ["a/b/one", "a/b/three", "a/bc/two", "z"]
    assert {m.key: m.size_bytes for m in metas} == {"a/b/one": 9, "a/b/three": 3, "a/bc/two": 2, "z": 0}
    assert all(abs(m.last_modified_s - time.time()) < 120 for m in metas)
    assert [m.key for m in store.list("a/b/")] == ["a/b/one", "a/b/three"]
    assert [m.key for m in store.list("a/b")] == ["a/b/one", "a/b/three", "a/bc/two"]  # plain string prefix
    assert [m.key for m in store.list("a/b/t")] == ["a/b/three"]
    assert store.list("nothing/") == []
    for bad in ("../", "a/../b", "/a", "a//b"):
        with pytest.raises(InvalidKey):
            store.list(bad)
    for bad in ("", "/abs", "a/../b", "a//b", "a/.hidden", "trailing/"):
        with pytest.raises(InvalidKey):
            store.put(bad, b"x")

    with pytest.raises(ObjectNotFound) as info:
        store.get("a/b/missing")
    assert info.value.key == "a/b/missing"
    store.delete("a/b/one")
    store.delete("a/b/one")  # idempotent
    store.delete("never/existed")
    assert not store.exists("a/b/one")
    assert [m.key for m in store.list("")] == ["a/b/three", "a/bc/two", "z"]


def test_download_writes_the_object_to_a_local_file_in_pieces(store: ObjectStore, tmp_path) -> None:
    """`download` (the local Parquet copies of chunk_store/parquet_cache.py): the object's bytes in a
    local file, larger than one piece; a missing object raises ObjectNotFound."""
    data = os.urandom(3 * 1024 * 1024 + 17)
    store.put("d/big", data)
    path = str(tmp_path / "copy")
    store.download("d/big", path)
    assert open(path, "rb").read() == data
    with pytest.raises(ObjectNotFound) as info:
        store.download("d/missing", str(tmp_path / "none"))
    assert info.value.key == "d/missing"


def test_put_if_absent_creates_once(store: ObjectStore) -> None:
    store.put_if_absent("k/first", b"mine")
    with pytest.raises(AlreadyExists) as info:
        store.put_if_absent("k/first", b"theirs")
    assert info.value.key == "k/first"
    assert store.get("k/first") == b"mine"
    assert [m.key for m in store.list("k/")] == ["k/first"]  # no temporary files left behind


def test_put_if_absent_concurrent_writers_exactly_one_wins(store: ObjectStore) -> None:
    writers = 8
    stores = [pickle.loads(pickle.dumps(store)) for _ in range(writers)]  # independent clients
    for rnd in range(RACE_ROUNDS):
        key = f"race/{rnd}"
        barrier = threading.Barrier(writers)
        winners: list[int] = []
        losers: list[int] = []

        def write(i: int) -> None:
            barrier.wait()
            try:
                stores[i].put_if_absent(key, f"writer-{i}".encode())
                winners.append(i)
            except AlreadyExists:
                losers.append(i)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(winners) == 1 and len(losers) == writers - 1, (rnd, winners, losers)
        assert store.get(key) == f"writer-{winners[0]}".encode()


def test_store_is_picklable_and_identified_by_url(store: ObjectStore, monkeypatch) -> None:
    store.put("p/q", b"data")
    clone = pickle.loads(pickle.dumps(store))
    assert clone == store and clone.url == store.url
    assert clone.get("p/q") == b"data"
    if isinstance(store, LocalObjectStore):
        assert store.url.startswith("file:///")
        assert object_store_from_url(store.url) == store
        assert object_store_from_url(store.root_dir) == store
    else:
        assert store.url == f"s3://{store.config.bucket}/tenant-a/objects"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOTO_ACCESS_KEY_ID)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOTO_SECRET_ACCESS_KEY)
        from_url = object_store_from_url(store.url, s3_endpoint=store.config.endpoint_url)
        assert isinstance(from_url, S3ObjectStore) and from_url.url == store.url
        # credentials come from the driver's environment and travel with the (pickled) store,
        # because Spark's Python workers may not share that environment
        assert from_url.config.access_key_id == MOTO_ACCESS_KEY_ID
        assert from_url.get("p/q") == b"data"


# --------------------------------------------------------------------------- preserved catalog on the store


def test_catalog_commit_race_exactly_one_wins(store: ObjectStore) -> None:
    """Two ingesters on one database commit revision N+1 at the same time: one wins, one is fenced."""
    config = PreservedCatalogConfig(transactions_until_checkpoint=5)  # checkpoints happen during the rounds
    PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    for rnd in range(RACE_ROUNDS):
        a, state_a = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
        other_ingester_store = pickle.loads(pickle.dumps(store))  # its own client / connections
        b, state_b = PreservedCatalog.create_or_load(other_ingester_store, DB, now_s=NOW_S, config=config)
        assert state_a == state_b and state_a.revision == rnd
        barrier = threading.Barrier(2)
        outcome: dict[str, object] = {}

        def commit(name: str, cat: PreservedCatalog) -> None:
            key = parquet_key(DB, "cpu", "2024-01-01", f"{name}-{rnd}")
            barrier.wait()
            try:
                outcome[name] = cat.commit([_add(key, rnd + 1)], now_s=NOW_S + rnd)
            except RevisionConflict as exc:
                outcome[name] = exc

        threads = [threading.Thread(target=commit, args=(n, c)) for n, c in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        wins = {n: r for n, r in outcome.items() if isinstance(r, int)}
        losses = {n: e for n, e in outcome.items() if isinstance(e, RevisionConflict)}
        assert len(wins) == 1 and len(losses) == 1, (rnd, outcome)
        (winner, revision), (loser, conflict) = next(iter(wins.items())), next(iter(losses.items()))
        assert revision == rnd + 1 and conflict.revision == rnd + 1
        assert conflict.key == transaction_key(DB, rnd + 1)
        loser_cat = a if loser == "a" else b
        assert loser_cat.fenced and loser_cat.revision == rnd
        _, reloaded = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
        assert reloaded == (a if winner == "a" else b).state
        assert parquet_key(DB, "cpu", "2024-01-01", f"{winner}-{rnd}") in reloaded.files
        assert parquet_key(DB, "cpu", "2024-01-01", f"{loser}-{rnd}") not in reloaded.files
    _, final = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    assert final.revision == RACE_ROUNDS and len(final.files) == RACE_ROUNDS
    assert store.exists(transaction_key(DB, RACE_ROUNDS).replace(".txn", ".ckpt"))


# --------------------------------------------------------------------------- Parquet through pyarrow


def test_parquet_write_and_read_through_arrow_fs(store: ObjectStore) -> None:
    table = pa.table(
        {
            "host": pa.array(["a", "b", "a"]),
            "usage": pa.array([1.5, 2.5, None]),
            "time_ns": pa.array([1, 2, 3], pa.int64()),
        }
    )
    key = parquet_key(DB, "cpu", "2024-01-01", uuid.uuid4())
    fs, path = store.arrow_prepare_write(key)  # what an executor does
    pq.write_table(table, path, filesystem=fs)

    fs2, base = pickle.loads(pickle.dumps(store)).arrow_fs()  # e.g. on another executor
    assert path == f"{base}/{key}" == store.arrow_path(key)
    assert pq.read_table(f"{base}/{key}", filesystem=fs2).equals(table)
    assert pq.read_table(io.BytesIO(store.get(key))).equals(table)
    metas = store.list(f"{DB}/data/")
    assert [m.key for m in metas] == [key]
    assert metas[0].size_bytes == len(store.get(key))


# --------------------------------------------------------------------------- cleanup


def test_cleanup_deletes_only_old_unreferenced_files(store: ObjectStore) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    referenced = parquet_key(DB, "cpu", "2024-01-01", "referenced")
    orphan = parquet_key(DB, "cpu", "2024-01-01", "orphan")
    in_flight = parquet_key(DB, "cpu", "2024-01-02", "in-flight")
    removed = parquet_key(DB, "mem", "2024-01-01", "compacted-away")
    other_db = parquet_key("otherdb", "cpu", "2024-01-01", "orphan")
    not_parquet = f"{DB}/data/cpu/2024-01-01/notes.txt"
    for key in (referenced, orphan, in_flight, removed, other_db, not_parquet):
        store.put(key, b"PAR1")
    cat.commit([_add(referenced), _add(removed)], now_s=NOW_S)
    cat.commit([{"kind": "remove_parquet", "key": removed}], now_s=NOW_S)
    state = cat.state

    min_age_s = 3600.0
    now = time.time()
    # Everything was just written: too young to delete, whatever the catalog says.
    assert find_unreferenced(store, DB, state, {in_flight}, min_age_s, now_s=now) == []
    later = now + 2 * min_age_s
    assert find_unreferenced(store, DB, state, {in_flight}, min_age_s, now_s=later) == sorted([orphan, removed])
    assert delete_unreferenced(store, DB, state, {in_flight}, min_age_s, now_s=later) == sorted([orphan, removed])
    for key in (referenced, in_flight, other_db, not_parquet):
        assert store.exists(key), key
    assert not store.exists(orphan) and not store.exists(removed)
    # Once the persist commits the in-flight file it stays referenced.
    cat.commit([_add(in_flight)], now_s=NOW_S)
    assert delete_unreferenced(store, DB, cat.state, set(), min_age_s, now_s=later) == []
    assert store.exists(in_flight)
