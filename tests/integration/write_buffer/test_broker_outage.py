"""The write API answers UNAVAILABLE while the broker is down and succeeds once it is back.

Runs a second server (same Spark application, its own gRPC port) on a broker of its own
so stopping that broker does not disturb the rest of the session.
"""
from __future__ import annotations

import os
import time

import grpc
import pytest

from iox_spark.server.runtime.broker import free_port, start_broker
from iox_spark.server.api.client import IoxClient
from iox_spark.server.write_buffer.write_token import WriteToken, format_token
from iox_spark.catalog.sharding import topic_for
from tests.conftest import make_config
from tests.waiting import wait_for
from tests.timestamps import T0


def _write_until_ok(client, db, lp, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.write(db, lp, timeout_s=20)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _server_on_a_broker_of_its_own(session_tmp, name: str, db: str):
    """(port, broker, config, server, client, token): a server on an in-memory broker of its own,
    after a first write to `db` was applied."""
    from iox_spark.server.app import IoxServer

    port = free_port()
    b = start_broker(port)
    cfg = make_config(os.path.join(session_tmp, name), b.bootstrap, produce_timeout_ms=3000)
    srv = IoxServer(cfg)
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    c.wait_ready(60)
    tok = c.write(db, f"m v=1 {T0}\n")
    c.wait_applied(db, tok, timeout_s=60)
    return port, b, cfg, srv, c, tok


def _lose_an_acknowledged_write(port, b, srv, c, db: str, kp: int, first: int):
    """(broker, refusal): a write acknowledged at `first + 1` on Kafka partition `kp` but not applied
    (the consumer held back) is lost by restarting the in-memory broker empty on the same port;
    returns the new broker and the FAILED_PRECONDITION a write then gets, once the server noticed."""
    open(srv.pause_file, "w").close()  # the consumer holds back: the next write is acknowledged only
    assert c.write(db, f"m v=2 {T0 + 1}\n") == {kp: first + 1}
    b.stop()
    os.unlink(srv.pause_file)
    b = start_broker(port)  # same address, empty
    # the server notices at its next look at the topic (a write's metadata request, the tail's
    # check): on a slow host each refused write may itself take seconds
    deadline = time.monotonic() + 90
    while True:
        with pytest.raises(grpc.RpcError) as ei:
            c.write(db, f"m v=3 {T0 + 2}\n", timeout_s=20)
        if ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
            break
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION, ei.value
    return b, ei


def test_unavailable_while_broker_stopped_then_ok(iox_server, session_tmp, db):
    port, b, _cfg, srv, c, _tok = _server_on_a_broker_of_its_own(session_tmp, "outage", db)
    try:
        b.stop()
        t = time.monotonic()
        with pytest.raises(grpc.RpcError) as ei:
            c.write(db, f"m v=2 {T0 + 1}\n", timeout_s=30)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "unavailable" in ei.value.details().lower() or "kafka" in ei.value.details().lower()
        assert time.monotonic() - t < 25
        b = start_broker(port)  # same address; the in-memory broker starts empty
        back = time.monotonic()
        # writes recover within 10 s of the broker being back (a producer whose messages timed out
        # against the vanished broker is replaced: its idempotence session could stay stuck)
        db2 = db + "_after"
        tok2 = _write_until_ok(c, db2, f"m v=4 {T0 + 3}\n", timeout_s=10)
        assert time.monotonic() - back < 10
        c.wait_applied(db2, tok2, timeout_s=60)
        assert c.query(db2, "SELECT v FROM m").to_pylist() == [{"v": 4.0}]
        # the old database's topic is a new one now: everything it had was applied (nothing lost),
        # but the server cannot read the new topic before a restart, and says so
        with pytest.raises(grpc.RpcError) as ei:
            c.write(db, f"m v=3 {T0 + 2}\n", timeout_s=20)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no acknowledged write was lost" in ei.value.details()
    finally:
        c.close()
        srv.stop()
        b.stop()


def _metrics(http_port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_a_broker_that_comes_back_empty_is_a_loss_reported_and_refused_until_accepted(iox_server, session_tmp, db):
    """An acknowledged write not applied yet (the consumer is held back) is lost when the in-memory
    broker restarts empty: the next write to the database answers FAILED_PRECONDITION naming the
    lost offsets and how to accept them, `iox status` lists the loss and /metrics counts it; a
    restart refuses to start without --skip-lost-writes and accepts the loss with it."""
    import dataclasses

    from iox_spark.server.app import IoxServer
    from iox_spark.server.consume.recovery import LostWrites

    port, b, cfg, srv, c, tok = _server_on_a_broker_of_its_own(session_tmp, f"loss-{db}", db)
    try:
        (kp, first), = tok.items()
        b, ei = _lose_an_acknowledged_write(port, b, srv, c, db, kp, first)
        msg = ei.value.details()
        assert f"Kafka partition {kp} offsets [{first + 1}, {first + 2})" in msg and "--skip-lost-writes" in msg
        st = c.status(db)["databases"][0]
        assert st["topic_replaced"] is True
        assert [(int(r["partition"]), int(r["from_offset"]), int(r["to_offset_exclusive"]), r["accepted"])
                for r in st["lost_writes"]] == [(kp, first + 1, first + 2, False)]
        assert f'iox_lost_write_ranges_total{{database="{db}"}} 1.0' in _metrics(cfg.http_port)
        with pytest.raises(grpc.RpcError) as ei:  # deletes too
            c.delete(db, T0, T0 + 10, table="m")
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # what was applied is persisted (in the background) and stays queryable
        wait_for(lambda: _files(c, db), 60, "the applied write to be persisted")
        assert c.query(db, "SELECT v FROM m").to_pylist() == [{"v": 1.0}]
        # another database works on the broker that came back
        db2 = db + "_other"
        c.wait_applied(db2, c.write(db2, f"m v=4 {T0 + 3}\n"), timeout_s=60)
    finally:
        c.close()
        srv.stop()
    with pytest.raises(LostWrites):
        IoxServer(dataclasses.replace(cfg, grpc_port=0, http_port=0)).start()
    srv = IoxServer(dataclasses.replace(cfg, grpc_port=0, http_port=0, skip_lost_writes=True))
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        c.wait_ready(60)
        c.wait_applied(db, c.write(db, f"m v=5 {T0 + 4}\n"), timeout_s=60)
        assert c.query(db, "SELECT v FROM m ORDER BY time").to_pylist() == [{"v": 1.0}, {"v": 5.0}]
        st = c.status(db)["databases"][0]
        # at start the server finds the topic it had read gone, and from its ack log what it had
        # acknowledged there: the loss found while it ran is the same record (kept in the preserved
        # catalog, with its known end), accepted now; no other partition got an acknowledged write
        assert st["topic_replaced"] is False
        assert [(int(r["partition"]), int(r["from_offset"]), int(r["to_offset_exclusive"]), r["accepted"])
                for r in st["lost_writes"]] == [(kp, first + 1, first + 2, True)]
        assert all(r["accepted_at_s"] >= r["detected_at_s"] > 0 for r in st["lost_writes"])
    finally:
        c.close()
        srv.stop()
        b.stop()


def _files(c, db) -> list:
    st = c.status(db)["databases"][0]
    return [f for t in st["tables"] for p in t["partitions"] for f in p["files"]]


def test_lost_writes_accepted_while_running_continue_in_a_new_epoch_and_the_record_survives_a_restart(
        iox_server, session_tmp, db):
    """The loss of the previous test, accepted with `iox accept-lost-writes` instead of a restart:
    what was applied is persisted, the database continues on the new topic in a new write-buffer
    epoch, writes are taken again and applied once; the loss stays recorded, accepted with the time,
    also after a restart (which needs no --skip-lost-writes)."""
    import dataclasses

    from iox_spark.server.app import IoxServer

    port, b, cfg, srv, c, tok = _server_on_a_broker_of_its_own(session_tmp, f"accept-{db}", db)
    try:
        (kp, first), = tok.items()
        b, ei = _lose_an_acknowledged_write(port, b, srv, c, db, kp, first)
        assert f"iox accept-lost-writes --db {db}" in ei.value.details()
        before = time.time()
        r = c.accept_lost_writes(db)
        assert r["new_topic"] is True and int(r["epoch"]) == 1
        assert [(x["partition"], int(x["from_offset"]), int(x["to_offset_exclusive"]), x["accepted"])
                for x in r["accepted"]] == [(kp, first + 1, first + 2, True)]
        st = c.status(db)["databases"][0]
        assert st["topic_replaced"] is False and int(st["epoch"]) == 1
        # a write token of the old epoch names messages of the old topic: refused, never waited for
        with pytest.raises(grpc.RpcError) as ei:
            c.query(db, "SELECT v FROM m", timeout_s=30, after=format_token(WriteToken(topic_for(db), None, 0, tok)))
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "epoch 0" in ei.value.details()
        (rec,) = st["lost_writes"]
        assert rec["accepted"] is True and rec["accepted_at_s"] >= before and int(rec["epoch"]) == 0
        assert _files(c, db)  # what was applied is persisted
        with pytest.raises(grpc.RpcError) as ei:  # nothing left to accept
            c.accept_lost_writes(db)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # writes are taken again, on the new topic; each applied once, after the persisted one
        tok3 = c.write(db, f"m v=3 {T0 + 2}\n")
        c.wait_applied(db, tok3, timeout_s=90)
        c.delete(db, T0 + 2, T0 + 3, table="m", predicate="")  # ordered after v=3 in the new epoch
        c.wait_applied(db, c.write(db, f"m v=4 {T0 + 3}\n"), timeout_s=90)
        assert c.query(db, "SELECT v FROM m ORDER BY v").to_pylist() == [{"v": 1.0}, {"v": 4.0}]
    finally:
        c.close()
        srv.stop()
    # a restart reads the new topic from its start (the new epoch's checkpoint names it): no
    # --skip-lost-writes needed, nothing applied twice, the accepted loss still listed
    srv = IoxServer(dataclasses.replace(cfg, grpc_port=0, http_port=0))
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    try:
        c.wait_ready(60)
        c.wait_applied(db, c.write(db, f"m v=5 {T0 + 4}\n"), timeout_s=90)
        assert c.query(db, "SELECT v FROM m ORDER BY v").to_pylist() == [{"v": 1.0}, {"v": 4.0}, {"v": 5.0}]
        st = c.status(db)["databases"][0]
        assert int(st["epoch"]) == 1
        assert [(x["partition"], int(x["from_offset"]), x["accepted"]) for x in st["lost_writes"]] == \
            [(kp, first + 1, True)]
        assert st["lost_writes"][0]["accepted_at_s"] == rec["accepted_at_s"]
    finally:
        c.close()
        srv.stop()
        b.stop()
