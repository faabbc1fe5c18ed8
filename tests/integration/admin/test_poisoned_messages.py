"""A message that fails to apply on its own is set aside; nothing else stops.

Real parts: a Tansu broker of the module's own, the session's Spark application, a server of each
test's own (its own data directory and gRPC/HTTP ports). Two ways a message fails: the consumer's fault
point (catalog/crash_points.py `apply_table`, armed and disarmed in this process: a fault an
operator removes, then retries) and a message produced straight to the database's topic with
the headers of a delete and a value that makes applying the delete raise (a bad message an
operator accepts as skipped).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import urllib.request
import uuid

import grpc
import pytest

from iox_spark.catalog.crash_points import FaultPoint, arm_fault, disarm_fault
from iox_spark.server.write_buffer.wire_format import encode_delete
from iox_spark.catalog.sharding import partition_for, topic_for
from tests.conftest import make_config, start_server
from tests.waiting import wait_for
from tests.timestamps import T0

PARTITIONS = 4  # as the tests' other servers (a topic keeps its partition count)
KP = partition_for("m", PARTITIONS)  # "m" and "io" share it; "q" is on another one
assert partition_for("io", PARTITIONS) == KP and partition_for("q", PARTITIONS) != KP


@pytest.fixture
def server(iox_server, own_broker, session_tmp):
    cfg = make_config(os.path.join(session_tmp, f"poison-{uuid.uuid4().hex[:6]}"), own_broker.bootstrap,
                      partitions=PARTITIONS)
    srv, c = start_server(cfg)
    yield cfg, srv, c
    c.close()
    srv.stop()


def _metrics(cfg) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{cfg.http_port}/metrics", timeout=10) as r:
        return r.read().decode()


def _poisoned(c, db) -> list:
    return c.status(db)["databases"][0]["poisoned"]


def _held(c, db) -> list:
    return [r for r in _poisoned(c, db) if r["state"] == "held"]


def _values(c, db, table="m") -> list:
    return [r["v"] for r in c.query(db, f"SELECT v FROM {table} ORDER BY v").to_pylist()]


def _applied(c, db, kp=KP) -> int:
    return c.applied(db).get(kp, -1)


def test_a_message_that_fails_is_held_while_everything_else_goes_on_then_retried(server):
    cfg, srv, c = server
    db, other = f"p_{uuid.uuid4().hex[:8]}", f"o_{uuid.uuid4().hex[:8]}"
    c.wait_applied(db, c.write(db, f"m v=1 {T0}\n"), timeout_s=90)
    c.wait_applied(other, c.write(other, f"m v=10 {T0}\n"), timeout_s=90)
    arm_fault(FaultPoint.APPLY_TABLE, f"{db}/m")
    try:
        (kp, poison), = c.write(db, f"m v=2 {T0 + 1}\n").items()
        assert kp == KP
        later = c.write(db, f"m v=3 {T0 + 2}\nio v=4 {T0 + 3}\n")  # after it on its partition
        elsewhere = c.write(db, f"q v=5 {T0 + 4}\n")  # another partition of the database
        held = wait_for(lambda: _held(c, db), 120, "the message to be held")
        assert [(r["topic"], r["partition"], int(r["offset"]), r["table"], r["kind"], r["attempts"]) for r in held] \
            == [(topic_for(db), KP, poison, "m", "write", 1)]
        assert "injected fault" in held[0]["error"] and held[0]["detected_at_s"] > 0
        # everything else goes on: the other database (exact rows), another partition of the database
        c.wait_applied(other, c.write(other, f"m v=11 {T0 + 1}\n"), timeout_s=90)
        assert _values(c, other) == [10.0, 11.0]
        c.wait_applied(db, elsewhere, timeout_s=90)
        assert _values(c, db, "q") == [5.0]
        # the held partition stops before it: nothing after it is applied or visible
        assert _applied(c, db) == poison - 1
        assert _values(c, db) == [1.0]
        text = _metrics(cfg)
        assert f'iox_poisoned_messages_total{{database="{db}"}} 1.0' in text
        assert f'iox_poisoned_messages_held{{database="{db}"}} 1.0' in text
        # still held a while later (no retry loop lets it through), the rest still goes on
        c.wait_applied(other, c.write(other, f"m v=12 {T0 + 2}\n"), timeout_s=90)
        assert _applied(c, db) == poison - 1 and len(_held(c, db)) == 1
        # `iox persist` persists what it can and says what it could not, and why
        r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "iox"), "persist", "--db", db, "--addr",
                            f"127.0.0.1:{srv.grpc_port}"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert [(s["kafka_partition"], s["reason"]) for s in json.loads(r.stdout)["skipped"]] == [
            (KP, f"poisoned message: its writes from offset {poison} on are not applied here, they wait in Kafka")]
        assert [line for line in r.stderr.splitlines() if line.startswith("warning")] == [f"warning: not persisted: Kafka partition {KP}: poisoned message: its writes "
                                         f"from offset {poison} on are not applied here, they wait in Kafka"]
        with pytest.raises(grpc.RpcError) as ei:
            c.retry_poisoned(db, partition=KP, offset=poison + 1)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        disarm_fault(FaultPoint.APPLY_TABLE, f"{db}/m")
    # the fault is gone: retried, it and everything after it is applied, each once
    (retried,) = c.retry_poisoned(db)
    assert (int(retried["offset"]), retried["state"]) == (poison, "retrying")
    c.wait_applied(db, later, timeout_s=120)
    assert _values(c, db) == [1.0, 2.0, 3.0]
    assert _values(c, db, "io") == [4.0]
    assert _values(c, db, "q") == [5.0]
    wait_for(lambda: _poisoned(c, db) == [], 30, "the applied message's record to go")
    assert f'iox_poisoned_messages_held{{database="{db}"}} 0.0' in _metrics(cfg)
    c.wait_applied(db, c.write(db, f"m v=6 {T0 + 5}\n"), timeout_s=90)
    assert _values(c, db) == [1.0, 2.0, 3.0, 6.0]


def _produce_bad_delete(bootstrap: str, db: str) -> int:
    """A message with a delete's headers whose value makes applying it raise (a start time that
    is not an integer nanosecond: JSON's 1e999 is infinite); returns its offset."""
    from confluent_kafka import Producer

    w = encode_delete("m", 0, 10, [])
    value = b'{"table":"m","start_ns":1e999,"stop_ns_exclusive":10,"predicate":[]}'
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    got = []
    p.produce(topic_for(db), value=value, key=w.key, headers=w.headers, partition=KP,
              on_delivery=lambda err, msg: got.append((err, msg.offset())))
    p.flush(30)
    (err, offset), = got
    assert err is None, err
    return offset


def test_a_bad_message_accepted_is_skipped_for_good_also_after_a_restart(server, own_broker):
    cfg, srv, c = server
    db, other = f"a_{uuid.uuid4().hex[:8]}", f"o_{uuid.uuid4().hex[:8]}"
    c.wait_applied(db, c.write(db, f"m v=1 {T0}\n"), timeout_s=90)
    poison = _produce_bad_delete(own_broker.bootstrap, db)
    later = c.write(db, f"m v=2 {T0 + 1}\n")
    assert later == {KP: poison + 1}
    held = wait_for(lambda: _held(c, db), 120, "the bad delete to be held")
    assert [(int(r["offset"]), r["kind"], r["table"]) for r in held] == [(poison, "delete", "m")]
    assert "OverflowError" in held[0]["error"]
    c.wait_applied(other, c.write(other, f"m v=10 {T0}\n"), timeout_s=90)
    assert _values(c, other) == [10.0]
    assert _values(c, db) == [1.0] and _applied(c, db) == poison - 1
    # accepted: recorded, kept in status as accepted; the partition continues after it
    (acc,) = c.accept_poisoned(db, partition=KP, offset=poison)
    assert acc["state"] == "accepted" and acc["accepted_at_s"] >= acc["detected_at_s"] > 0
    c.wait_applied(db, later, timeout_s=120)
    assert _values(c, db) == [1.0, 2.0]
    (rec,) = _poisoned(c, db)
    assert (int(rec["offset"]), rec["state"]) == (poison, "accepted")
    text = _metrics(cfg)
    assert f'iox_poisoned_messages_total{{database="{db}"}} 1.0' in text
    assert f'iox_poisoned_messages_held{{database="{db}"}} 0.0' in text
    with pytest.raises(grpc.RpcError) as ei:  # nothing held any more
        c.accept_poisoned(db)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    # a restart replays the write buffer (nothing was persisted): the accepted message is skipped
    # again (recorded in the preserved catalog), every write is applied once
    c.close()
    srv.stop()
    srv, c = start_server(dataclasses.replace(cfg, grpc_port=0, http_port=0))
    try:
        c.wait_applied(db, later, timeout_s=120)
        assert _values(c, db) == [1.0, 2.0]
        assert [(int(r["offset"]), r["state"]) for r in _poisoned(c, db)] == [(poison, "accepted")]
        c.wait_applied(db, c.write(db, f"m v=3 {T0 + 2}\n"), timeout_s=90)
        assert _values(c, db) == [1.0, 2.0, 3.0]
        assert _held(c, db) == []
    finally:
        c.close()
        srv.stop()


def test_a_message_held_during_replay_holds_only_its_own_databases_persists(server, own_broker):
    """After a restart, a database whose replay stops at a held message stays replaying (its
    persists wait: what it holds is not all there yet); another database persists meanwhile."""
    cfg, srv, c = server
    db, other = f"r_{uuid.uuid4().hex[:8]}", f"o_{uuid.uuid4().hex[:8]}"
    c.wait_applied(db, c.write(db, f"m v=1 {T0}\n"), timeout_s=90)
    poison = _produce_bad_delete(own_broker.bootstrap, db)
    wait_for(lambda: _held(c, db), 120, "the bad delete to be held")
    c.close()
    srv.stop()
    fast = {"persist_age_threshold_s": 1.0, "late_arrive_window_s": 1.0}
    srv, c = start_server(dataclasses.replace(cfg, grpc_port=0, http_port=0, lifecycle=fast))
    try:
        wait_for(lambda: _held(c, db), 120, "the bad delete to be held again by the replay")
        assert c.status(db)["databases"][0]["replaying"] is True
        c.wait_applied(other, c.write(other, f"m v=10 {T0}\n"), timeout_s=90)

        def persisted_rows(name):
            (d,) = c.status(name)["databases"]
            return sum(int(f["rows"]) for t in d["tables"] for p in t.get("partitions", []) for f in p.get("files", []))

        wait_for(lambda: persisted_rows(other) == 1, 90, "the other database to persist on its own")
        assert c.status(db)["databases"][0]["replaying"] is True and _applied(c, db) == poison - 1
        c.accept_poisoned(db, partition=KP, offset=poison)
        wait_for(lambda: not c.status(db)["databases"][0]["replaying"], 90, "the replay to catch up")
        assert _values(c, db) == [1.0] and _values(c, other) == [10.0]
    finally:
        c.close()
        srv.stop()


def test_cli_poison_commands_name_what_they_did(server):
    cfg, srv, c = server
    from iox_spark.server.cli.main import main

    db = f"c_{uuid.uuid4().hex[:8]}"
    c.wait_applied(db, c.write(db, f"m v=1 {T0}\n"), timeout_s=90)
    arm_fault(FaultPoint.APPLY_TABLE, f"{db}/m")
    try:
        (_kp, poison), = c.write(db, f"m v=2 {T0 + 1}\n").items()
        wait_for(lambda: _held(c, db), 120, "the message to be held")
    finally:
        disarm_fault(FaultPoint.APPLY_TABLE, f"{db}/m")
    addr = f"127.0.0.1:{srv.grpc_port}"
    with pytest.raises(SystemExit):  # an offset needs its partition
        main(["poison", "accept", "--addr", addr, "--db", db, "--offset", str(poison)])
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["poison", "accept", "--addr", addr, "--db", db, "--partition", str(KP),
                     "--offset", str(poison)]) == 0
    (msg,) = json.loads(out.getvalue())["messages"]
    assert (int(msg["offset"]), msg["state"]) == (poison, "accepted")
    c.wait_applied(db, c.write(db, f"m v=3 {T0 + 2}\n"), timeout_s=120)
    assert _values(c, db) == [1.0, 3.0]
