"""Deletes end to end on real parts: ordered with writes through Kafka, applied at every chunk
stage (open, closed, compacted, persisted, unloaded), recorded in the preserved catalog, and
kept across a restart."""
from __future__ import annotations

import os
import uuid

import grpc
import pytest

from iox_spark.server.runtime.broker import start_broker
from iox_spark.server.api.client import IoxClient
from tests.conftest import make_config
from tests.timestamps import T0

Q = "SELECT host, v, time_ns FROM cpu ORDER BY host, time_ns"


class _Srv:
    def __init__(self, session_tmp, broker=None, data_dir=None):
        from iox_spark.server.app import IoxServer

        self.broker = broker or start_broker()
        self.data_dir = data_dir or os.path.join(session_tmp, f"del-{uuid.uuid4().hex[:6]}")
        self.server = IoxServer(make_config(self.data_dir, self.broker.bootstrap, http_port=0,
                                            lifecycle={"worker_backoff_ms": 3_600_000}))
        self.server.start()
        self.client = IoxClient(f"127.0.0.1:{self.server.grpc_port}")
        self.client.wait_ready(60)

    def restart(self, session_tmp):
        self.client.close()
        self.server.stop()
        return _Srv(session_tmp, self.broker, self.data_dir)

    def stop(self):
        self.client.close()
        self.server.stop()


@pytest.fixture(scope="module")
def srv(iox_server, session_tmp):
    s = _Srv(session_tmp)
    yield s
    s.stop()
    s.broker.stop()


def _w(c, db, lines):
    c.wait_applied(db, c.write(db, "\n".join(lines) + "\n"), timeout_s=90)


def _d(c, db, start, stop, pred="", table="cpu"):
    c.wait_applied(db, c.delete(db, start, stop, pred, table), timeout_s=90)


def _rows(c, db):
    return [(r["host"], r["v"], r["time_ns"] - T0) for r in c.query(db, Q).to_pylist()]


BASE = [f"cpu,host={h} v={i} {T0 + i}" for h in ("a", "b") for i in range(4)]
AFTER_DELETE = [("a", 0.0, 0), ("a", 3.0, 3), ("b", 0.0, 0), ("b", 1.0, 1), ("b", 2.0, 2), ("b", 3.0, 3)]


def _stage(c, db, stage, server):
    part = "2023-11-14"
    if stage == "compacted":
        _w(c, db, [f"cpu,host=a v=0 {T0}"])  # a second chunk to compact with
        assert c.compact(db, "cpu", part)["compacted"] is True
    if stage in ("persisted", "unloaded"):
        c.persist(db)
    if stage == "unloaded":
        db_ = server.catalog.database(db)
        for ch in list(db_.partitions["cpu"][part].chunks):
            from iox_spark.lifecycle.unload import unload_chunk

            assert unload_chunk(server.spark, server.catalog, db_, "cpu", part, ch.id, server.store,
                                server.parquet_cache)


@pytest.mark.parametrize("stage", ["open", "closed", "compacted", "persisted", "unloaded"])
def test_delete_at_each_chunk_stage_and_after_restart(srv, session_tmp, stage, request):
    c, db = srv.client, f"d_{stage}_{uuid.uuid4().hex[:6]}"
    _w(c, db, BASE)
    if stage == "closed":
        _w(c, db, [f"cpu,host=b v=3 {T0 + 3}"])  # a second chunk: the first one is closed
    _stage(c, db, stage, srv.server)
    _d(c, db, T0 + 1, T0 + 3, "host = 'a'")
    assert _rows(c, db) == AFTER_DELETE
    st = c.status(db)["databases"][0]
    assert st["tables"]
    if stage == "persisted":
        c.persist(db)  # a persist flushes the whole delete mailbox into its transaction
    if stage == "unloaded":  # the background flush records it without any persist
        import time

        pending = srv.server.catalog.database(db).deletes
        assert len(pending.unrecorded()) == 1
        assert srv.server.lifecycle.flush_mailboxes(time.time()) >= 1
        assert pending.unrecorded() == []
    new = srv.restart(session_tmp)
    srv.server, srv.client = new.server, new.client
    srv.client.wait_caught_up(db)
    assert _rows(srv.client, db) == AFTER_DELETE


def test_write_delete_write_keeps_only_the_last_write(srv, session_tmp):
    c, db = srv.client, f"wdw_{uuid.uuid4().hex[:6]}"
    _w(c, db, [f"cpu,host=a v=1 {T0}"])
    _d(c, db, T0, T0 + 10)
    _w(c, db, [f"cpu,host=a v=2 {T0}"])  # same series and time, inside the deleted range: survives
    assert _rows(c, db) == [("a", 2.0, 0)]
    new = srv.restart(session_tmp)  # replayed from Kafka, in order
    srv.server, srv.client = new.server, new.client
    srv.client.wait_caught_up(db)
    assert _rows(srv.client, db) == [("a", 2.0, 0)]
    srv.client.persist(db)
    assert _rows(srv.client, db) == [("a", 2.0, 0)]


def test_database_wide_delete_hits_every_table(srv):
    c, db = srv.client, f"dbw_{uuid.uuid4().hex[:6]}"
    _w(c, db, [f"cpu,host=a v=1 {T0}", f"mem,host=a v=2 {T0}", f"disk,host=b v=3 {T0}"])
    _d(c, db, T0, T0 + 1, "host = 'a'", table="")
    assert c.query(db, "SELECT count(*) AS n FROM cpu").to_pylist() == [{"n": 0}]
    assert c.query(db, "SELECT count(*) AS n FROM mem").to_pylist() == [{"n": 0}]
    assert c.query(db, "SELECT host, v FROM disk").to_pylist() == [{"host": "b", "v": 3.0}]


def test_delete_racing_a_persist(srv, session_tmp):
    import threading

    c, db = srv.client, f"race_{uuid.uuid4().hex[:6]}"
    _w(c, db, [f"cpu,host=h{i % 5} v={i} {T0 + i}" for i in range(500)])
    t = threading.Thread(target=lambda: c.persist(db))
    t.start()
    _d(c, db, T0, T0 + 500, "host = 'h1'")
    t.join()
    c.persist(db)
    q = "SELECT host, count(*) AS n FROM cpu GROUP BY host ORDER BY host"
    expect = [{"host": f"h{i}", "n": 100} for i in (0, 2, 3, 4)]
    assert c.query(db, q).to_pylist() == expect
    new = srv.restart(session_tmp)
    srv.server, srv.client = new.server, new.client
    srv.client.wait_caught_up(db)
    assert srv.client.query(db, q).to_pylist() == expect


@pytest.mark.parametrize("pred,start,stop,fragment", [
    ("host = 'a' OR host = 'b'", T0, T0 + 1, "OR"),
    ("v > 1", T0, T0 + 1, ">"),
    ("nope = 'x'", T0, T0 + 1, "nope"),
    ("host = 1", T0, T0 + 1, "host"),
    ("", "not-a-time", T0, "start"),
    ("", T0 + 5, T0, "stop"),
])
def test_invalid_deletes_are_rejected_and_nothing_reaches_kafka(srv, pred, start, stop, fragment):
    c, db = srv.client, f"inv_{uuid.uuid4().hex[:6]}"
    tok = c.write(db, f"cpu,host=a v=1 {T0}\n")
    c.wait_applied(db, tok, timeout_s=90)
    with pytest.raises(grpc.RpcError) as ei:
        c.delete(db, start, stop, pred, "cpu")
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in ei.value.details()
    assert c.write(db, f"cpu,host=a v=2 {T0 + 1}\n") == {p: off + 1 for p, off in tok.items()}
