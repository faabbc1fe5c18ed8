"""One committer: two servers on the same object store and database. A server that another one
committed a newer catalog revision over is fenced for that database — it learns it by losing a
commit, or within seconds by its fence probe without committing anything — and then refuses the
database's writes, deletes and persists (FAILED_PRECONDITION; HTTP 409), never commits to it or
cleans it up again (the new owner's files stay), and reports it in `iox status`; it keeps serving
its other databases."""
from __future__ import annotations

import dataclasses
import http.client
import os
import time
import uuid

import grpc
import pytest

from iox_spark.server.runtime.broker import start_broker
from iox_spark.server.api.client import IoxClient
from tests.conftest import make_config
from tests.waiting import wait_for
from tests.timestamps import T0


def _servers(session_tmp):
    """Config of server A (its own broker, the HTTP write API on a free port, lifecycle rounds an hour
    apart: nothing persists unless asked) and of server B on the same broker and object store."""
    broker = start_broker()
    base = make_config(os.path.join(session_tmp, f"fence-{uuid.uuid4().hex[:6]}"), broker.bootstrap,
                       lifecycle={"worker_backoff_ms": 3_600_000})
    other = dataclasses.replace(base, grpc_port=0, http_port=0, data_dir=base.data_dir + "-b",
                                object_store=base.object_store_url)
    return broker, base, other


def _refused(call, revision: int) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value
    assert f"revision {revision}" in info.value.details()
    return info.value


def _http_write(port: int, org: str, bucket: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", f"/api/v2/write?org={org}&bucket={bucket}", body=body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_second_committer_is_fenced_and_refuses_writes(iox_server, session_tmp):
    from iox_spark.server.app import IoxServer

    broker, base, other = _servers(session_tmp)
    db = f"f_{uuid.uuid4().hex[:6]}"
    a = IoxServer(base)
    a.start()
    ca = IoxClient(f"127.0.0.1:{a.grpc_port}")
    ca.wait_applied(db, ca.write(db, f"cpu v=1 {T0}\n"), timeout_s=90)
    # B shares the object store (and the broker): it loads the catalog at the same revision as A
    b = IoxServer(other)
    b.start()
    cb = IoxClient(f"127.0.0.1:{b.grpc_port}")
    try:
        cb.wait_caught_up(db)
        won = int(ca.persist(db)["persisted"][0]["revision"])
        _refused(lambda: cb.persist(db), won)  # that revision exists: B lost the race
        assert b.lifecycle.fenced == {db: won}
        _refused(lambda: cb.write(db, f"cpu v=9 {T0 + 9}\n"), won)
        # B keeps serving everything else
        assert not b._stopped.is_set()
        cb.wait_ready(5)
        other_db = f"g_{uuid.uuid4().hex[:6]}"
        cb.wait_applied(other_db, cb.write(other_db, f"cpu v=3 {T0}\n"), timeout_s=90)
        # A still owns the catalog and keeps committing
        ca.wait_applied(db, ca.write(db, f"cpu v=2 {T0 + 1}\n"), timeout_s=90)
        assert int(ca.persist(db)["persisted"][0]["revision"]) == won + 1
        assert a.lifecycle.fenced == {}
        # B no longer applies the database's write buffer: A's write stays out of B's memory and
        # answers, while B's later micro-batches apply its other database
        fenced_db = b.catalog.peek_database(db)
        applied = dict(fenced_db.applied_hi_inclusive)
        ca.wait_applied(db, ca.write(db, f"cpu v=7 {T0 + 7}\n"), timeout_s=90)
        n = b.ingestor.batches_applied
        cb.wait_applied(other_db, cb.write(other_db, f"cpu v=4 {T0 + 1}\n"), timeout_s=90)
        # that batch read every topic to its end, past A's write (produced before it)
        assert b.ingestor.wait_for_batches(n + 1, timeout_s=30)
        assert dict(fenced_db.applied_hi_inclusive) == applied
        assert cb.query(db, "SELECT v FROM cpu ORDER BY time").to_pylist() == [{"v": 1.0}]
        assert ca.query(db, "SELECT v FROM cpu ORDER BY time").to_pylist() == [{"v": 1.0}, {"v": 2.0}, {"v": 7.0}]
    finally:
        ca.close()
        cb.close()
        a.stop()
        b.stop()
        broker.stop()


def test_a_newer_revision_fences_a_server_that_commits_nothing(iox_server, session_tmp):
    from iox_spark.server.app import IoxServer

    broker, base, other = _servers(session_tmp)
    org, bucket = "f", uuid.uuid4().hex[:6]
    db = f"{org}_{bucket}"  # the database the HTTP write API writes (org, bucket) to
    a = IoxServer(base)
    a.start()
    ca = IoxClient(f"127.0.0.1:{a.grpc_port}")
    b = None
    cb = None
    try:
        ca.wait_applied(db, ca.write(db, f"cpu v=1 {T0}\n"), timeout_s=90)
        a_revision = int(ca.persist(db)["persisted"][0]["revision"])  # A holds the catalog
        a_files = [f for p in ca.status(db)["databases"][0]["tables"][0]["partitions"] for f in p["files"]]
        b = IoxServer(other)
        b.start()
        cb = IoxClient(f"127.0.0.1:{b.grpc_port}")
        cb.wait_caught_up(db)
        cb.wait_applied(db, cb.write(db, f"cpu v=2 {T0 + 1}\n"), timeout_s=90)
        [persisted] = cb.persist(db)["persisted"]  # the new owner commits revisions A never sees
        newer = int(persisted["revision"])
        assert newer == a_revision + 1 and persisted["files"]
        b_files = list(persisted["files"])
        started = time.monotonic()
        wait_for(lambda: a.lifecycle.fenced, 10, "server A to find the newer revision")
        assert time.monotonic() - started < 10
        assert a.lifecycle.fenced == {db: newer}
        assert a.lifecycle.preserved[db].revision == a_revision  # A committed nothing itself
        # writes, deletes and persists to the database are refused, naming the revision
        _refused(lambda: ca.write(db, f"cpu v=3 {T0 + 2}\n"), newer)
        _refused(lambda: ca.delete(db, T0, T0 + 10), newer)
        _refused(lambda: ca.persist(db), newer)
        status, body = _http_write(a.http.port, org, bucket, f"cpu v=4 {T0 + 3}\n".encode())
        assert status == 409 and b"conflict" in body and f"revision {newer}".encode() in body
        st = ca.status(db)["databases"][0]
        assert st["fenced"] is True and int(st["fenced_revision"]) == newer
        # A's cleanup deletes none of the new owner's files (nor its own, which B references)
        deleted = a.lifecycle.cleanup(time.time() + 10_000, 900.0)
        assert not [k for k in deleted if k.startswith(f"{db}/")]
        for key in b_files + [f["key"] for f in a_files]:
            assert a.store.exists(key), key
        # A keeps serving its other databases and its health
        assert not a._stopped.is_set()
        ca.wait_ready(5)
        other_db = f"g_{uuid.uuid4().hex[:6]}"
        ca.wait_applied(other_db, ca.write(other_db, f"cpu v=5 {T0}\n"), timeout_s=90)
        assert ca.persist(other_db)["persisted"]
        assert ca.status(other_db)["databases"][0]["fenced"] is False
        # B owns the database and keeps committing
        cb.wait_applied(db, cb.write(db, f"cpu v=6 {T0 + 4}\n"), timeout_s=90)
        assert int(cb.persist(db)["persisted"][0]["revision"]) == newer + 1
        assert b.lifecycle.fenced == {}
    finally:
        ca.close()
        if cb is not None:
            cb.close()
        a.stop()
        if b is not None:
            b.stop()
        broker.stop()
