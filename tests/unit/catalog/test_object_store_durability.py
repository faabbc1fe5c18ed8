"""Durability of the local object store: what `put` and the pyarrow write protocol
(`arrow_prepare_write` / `arrow_finish_write`) fsync, and that S3 needs nothing.

`os.fsync` is recorded (the path of each synced descriptor, in order) around real writes."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_spark.catalog.object_store import LocalObjectStore, S3Config, S3ObjectStore


@pytest.fixture
def synced(monkeypatch) -> list:
    """The paths `os.fsync` synced, in order."""
    paths: list = []
    real_fsync = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        real_fsync(fd)
        paths.append(path)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


@pytest.fixture
def root(tmp_path) -> str:
    return os.path.realpath(tmp_path / "objects")  # fsync paths are read back resolved


def _p(root: str, key: str = "") -> str:
    return os.path.join(root, *key.split("/")) if key else root


def _write_parquet(store: LocalObjectStore, key: str) -> None:
    fs, path = store.arrow_prepare_write(key)
    pq.write_table(pa.table({"x": [1, 2, 3]}), path, filesystem=fs)


def test_arrow_prepare_write_fsyncs_the_parent_of_every_directory_it_creates_once(root, synced):
    store = LocalObjectStore(root)
    fs, path = store.arrow_prepare_write("db/data/cpu/p/1.parquet")
    assert path == _p(root, "db/data/cpu/p/1.parquet") and os.path.isdir(_p(root, "db/data/cpu/p"))
    # created: objects, db, data, cpu, p; synced deepest first, the root's parent last
    assert synced == [_p(root, "db/data/cpu"), _p(root, "db/data"), _p(root, "db"), root, os.path.dirname(root)]
    synced.clear()
    store.arrow_prepare_write("db/data/cpu/p/2.parquet")
    assert synced == []  # nothing created: no fsync
    store.arrow_prepare_write("db/data/cpu/q/1.parquet")
    assert synced == [_p(root, "db/data/cpu")]


def test_arrow_finish_write_fsyncs_each_file_then_their_directories_once_each(root, synced):
    store = LocalObjectStore(root)
    keys = ["db/data/cpu/p/1.parquet", "db/data/cpu/p/2.parquet", "db/data/cpu/q/1.parquet"]
    for k in keys:
        _write_parquet(store, k)
    synced.clear()
    store.arrow_finish_write(keys)
    assert synced == [_p(root, keys[0]), _p(root, keys[1]), _p(root, keys[2]),
                      _p(root, "db/data/cpu/p"), _p(root, "db/data/cpu/q")]
    assert pq.read_table(_p(root, keys[0])).column("x").to_pylist() == [1, 2, 3]  # read-only: bytes untouched


def test_arrow_finish_write_of_a_missing_file_raises(root, synced):
    store = LocalObjectStore(root)
    store.arrow_prepare_write("db/data/cpu/p/1.parquet")
    with pytest.raises(FileNotFoundError):
        store.arrow_finish_write(["db/data/cpu/p/1.parquet"])


def test_put_makes_the_directories_it_creates_durable(root, synced):
    store = LocalObjectStore(root)
    store.put("db/catalog/0.txn", b"x")
    tmp = [p for p in synced if os.path.basename(p).startswith(".tmp-")]
    assert len(tmp) == 1  # the temporary file, renamed into place afterwards
    assert synced == [_p(root, "db"), root, os.path.dirname(root), tmp[0], _p(root, "db/catalog")]
    assert store.get("db/catalog/0.txn") == b"x"
    synced.clear()
    store.put_if_absent("db/catalog/1.txn", b"y")
    assert len(synced) == 2 and synced[1] == _p(root, "db/catalog")  # its temporary file, then the directory


def test_the_s3_store_finishes_a_write_without_any_request():
    store = S3ObjectStore(S3Config(bucket="bucket", endpoint_url="http://127.0.0.1:1"))
    store.arrow_finish_write(["db/data/cpu/p/1.parquet"])
    assert store._client is None  # no client created: an uploaded object is durable


@pytest.mark.parametrize("code, fails", [(5, True), (28, True), (22, False), (9, False)])  # EIO, ENOSPC | EINVAL, EBADF
def test_a_failed_fsync_of_the_directory_fails_the_write_one_it_cannot_do_at_all_does_not(root, monkeypatch, code,
                                                                                          fails):
    """A catalog commit (put_if_absent) whose directory entry cannot be made durable fails with
    NotDurable, the OSError chained; a file system that does not fsync directories at all
    (EINVAL, EBADF) is left as it is."""
    from iox_spark.catalog.errors import NotDurable

    store = LocalObjectStore(root)
    store.put("db/catalog/x", b"made before")  # the directories exist: only the entry's fsync is left
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    if fails:
        with pytest.raises(NotDurable) as ei:
            store.put_if_absent("db/catalog/00000000000000000001.txn", b"{}")
        assert ei.value.errno == code and ei.value.path == _p(root, "db/catalog")
        assert isinstance(ei.value.__cause__, OSError)
    else:
        store.put_if_absent("db/catalog/00000000000000000001.txn", b"{}")
    assert store.get("db/catalog/00000000000000000001.txn") == b"{}"
