"""The write buffer's tail on the real server: acknowledged writes Spark has not applied are
queryable at once, exactly as the consumer will apply them (last write wins across chunks and
tail, deletes by write-buffer order, multi-message requests whole or not at all), and the
answers stay the same once Spark applied them.

The consumer is held with its backpressure pause file (the stream source takes no offsets while
it exists), so what the queries see comes from the tail alone."""
from __future__ import annotations

import os
import time

import pyarrow as pa
from confluent_kafka import Producer

from iox_spark.catalog.schema import Column
from iox_spark.server.write_buffer.wire_format import encode_write
from iox_spark.catalog.sharding import partition_for
from tests.waiting import wait_for
from tests.timestamps import T0


def _merge(*tokens) -> dict:
    out: dict = {}
    for t in tokens:
        for kp, off in t.items():
            out[int(kp)] = max(out.get(int(kp), -1), off)
    return out


def _rows(client, db, sql):
    return sorted(client.query(db, sql).to_pylist(), key=lambda r: tuple(str(v) for v in r.values()))


def _hold_consumer(srv):
    """Creates the pause file, then waits until the stream's current trigger (which may have asked
    for the ends before the file existed) ended: a write made after that is not applied while the
    file exists."""
    open(srv.pause_file, "w").close()
    query = srv.consumer._query
    wait_for(lambda: not query.status["isTriggerActive"], 30, "the stream's current trigger to end")


def test_unapplied_writes_deletes_and_transactions_are_queryable_from_the_tail(iox_server, client, db):
    srv = iox_server
    tok = client.write(db, f"cpu,host=a usage=1 {T0}\ncpu,host=b usage=2 {T0 + 1}\n")
    client.wait_applied(db, tok)
    _hold_consumer(srv)
    try:
        toks = [
            client.write(db, f"cpu,host=a usage=10 {T0}\n"),  # rewrites an applied point: last write wins
            client.write(db, f"cpu,host=c usage=3 {T0 + 2}\nmem,host=c free=7i {T0 + 2}\n"),  # a transaction
            client.delete(db, T0, T0 + 100, "host = 'b'", table="cpu"),  # hits an applied row
            client.write(db, f"cpu,host=b usage=5 {T0 + 3}\n"),  # after the delete: stays
            client.delete(db, T0 + 2, T0 + 3, "host = 'c'"),  # database-wide: a transaction of delete parts
            client.write(db, f"mem,host=c free=8i {T0 + 2}\n"),  # after it: stays
            client.write(db, f"disk,host=a used=1i {T0}\n"),  # a table Spark has not seen yet
        ]
        token = _merge(*toks)
        client.wait_visible(db, token, timeout_s=30)
        res = srv.query_engine.run(db, "SELECT host, usage, time_ns FROM cpu")
        assert all(res.visible_hi_inclusive[kp] >= off for kp, off in token.items())
        assert any(res.applied_hi_inclusive.get(kp, -1) < off for kp, off in token.items()), \
            "the consumer applied writes while held: the answers below would not come from the tail"
        expected = {
            "cpu": [{"host": "a", "usage": 10.0, "time_ns": T0}, {"host": "b", "usage": 5.0, "time_ns": T0 + 3}],
            "mem": [{"host": "c", "free": 8, "time_ns": T0 + 2}],
            "disk": [{"host": "a", "used": 1, "time_ns": T0}],
        }
        cols = {"cpu": "host, usage, time_ns", "mem": "host, free, time_ns", "disk": "host, used, time_ns"}
        seen_from_tail = {t: _rows(client, db, f"SELECT {c} FROM {t}") for t, c in cols.items()}
        assert seen_from_tail == expected
        assert sorted(res.table.to_pylist(), key=lambda r: r["host"]) == expected["cpu"]
        # a join of two tables reads both tails in one cut
        assert _rows(client, db, "SELECT c.host, d.used FROM cpu c JOIN disk d ON c.host = d.host") == [
            {"host": "a", "used": 1}]
    finally:
        os.unlink(srv.pause_file)
    client.wait_applied(db, token, timeout_s=60)
    assert {t: _rows(client, db, f"SELECT {c} FROM {t}") for t, c in cols.items()} == expected


def test_a_query_of_a_table_without_tail_rows_reflects_the_applied_watermark(iox_server, client, db):
    tok = client.write(db, f"cpu,host=a usage=1 {T0}\n")
    client.wait_applied(db, tok)
    res = iox_server.query_engine.run(db, "SELECT count(*) AS n FROM cpu")
    assert res.table.column("n").to_pylist() == [1]
    assert res.visible_hi_inclusive == res.applied_hi_inclusive or all(
        res.visible_hi_inclusive[kp] >= off for kp, off in res.applied_hi_inclusive.items())


def test_the_tail_lets_go_of_what_spark_applied(iox_server, client, db):
    tok = client.write(db, "".join(f"cpu,host=h{i} usage={i} {T0 + i}\n" for i in range(100)))
    client.wait_applied(db, tok)
    topic = iox_server.catalog.database(db).topic
    deadline = time.monotonic() + 10
    while True:
        with iox_server.tail._lock:
            held = sum(len(pt.items) for (t, _kp), pt in iox_server.tail._parts.items() if t == topic)
        if held == 0:
            break
        assert time.monotonic() < deadline, f"the tail still holds {held} applied message(s)"
        time.sleep(0.05)


def test_a_query_sees_the_tables_it_names_and_show_tables_lists_them_all(iox_server, client, db):
    tok = client.write(db, f"cpu,host=a usage=1 {T0}\nmem,host=a free=2i {T0}\n")
    client.wait_applied(db, tok)
    tok = client.write(db, f"disk,host=a used=3i {T0}\n")  # maybe only in the tail yet
    client.wait_visible(db, tok)
    assert sorted(client.query(db, "SHOW TABLES").column("tableName").to_pylist()) == ["cpu", "disk", "mem"]
    assert client.query(db, "DESCRIBE disk").column("col_name").to_pylist()[:2] == ["host", "used"]
    assert client.query(db, "SELECT c.usage, m.free, d.used FROM cpu c JOIN mem m ON c.host = m.host "
                            "JOIN disk d ON d.host = c.host").to_pylist() == [{"usage": 1.0, "free": 2, "used": 3}]


def _foreign_write(bootstrap: str, topic: str, host: str, usage: float, t_ns: int) -> dict:
    """A write to table cpu produced by another router (the same wire format, not through this
    server): the tail learns of it only from Kafka. Returns its write token."""
    data = pa.table({"host": [host], "usage": [usage], "time": pa.array([t_ns], pa.int64())})
    w = encode_write("cpu", [Column("host", "tag", "string"), Column("usage", "field", "float"),
                             Column("time", "time", "time")], data, unique_keys=True)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "batch.num.messages": 1, "log_level": 3})
    acked = []
    p.produce(topic, value=w.value, key=w.key, headers=w.headers, partition=partition_for("cpu", 4),
              on_delivery=lambda err, m: acked.append((err, m.partition(), m.offset())))
    assert p.flush(30) == 0 and acked and acked[0][0] is None, acked
    return {acked[0][1]: acked[0][2]}


def test_another_producers_writes_reach_the_tail_from_kafka(iox_server, broker, client, db):
    """The tail holds this server's own acknowledged writes as the router hands them over; another
    producer's are read from Kafka: at the end of a partition (the periodic read) and between two
    of ours (a gap in what the router handed over)."""
    srv = iox_server
    client.wait_applied(db, client.write(db, f"cpu,host=a usage=1 {T0}\n"))
    topic = srv.catalog.database(db).topic
    _hold_consumer(srv)
    try:
        theirs = _foreign_write(broker.bootstrap, topic, "f1", 11.0, T0 + 1)  # at the end: nothing of ours after it
        client.wait_visible(db, theirs, timeout_s=30)
        theirs2 = _foreign_write(broker.bootstrap, topic, "f2", 12.0, T0 + 2)
        ours = client.write(db, f"cpu,host=b usage=2 {T0 + 3}\n")  # handed over while f2 is unread: a gap
        token = _merge(theirs, theirs2, ours)
        client.wait_visible(db, token, timeout_s=30)
        res = srv.query_engine.run(db, "SELECT host, usage FROM cpu")
        assert all(res.applied_hi_inclusive.get(kp, -1) < off for kp, off in theirs.items()), \
            "the consumer applied writes while held: the answers below would not come from the tail"
        expected = [{"host": "a", "usage": 1.0}, {"host": "b", "usage": 2.0}, {"host": "f1", "usage": 11.0},
                    {"host": "f2", "usage": 12.0}]
        assert _rows(client, db, "SELECT host, usage FROM cpu") == expected
    finally:
        os.unlink(srv.pause_file)
    client.wait_applied(db, token, timeout_s=60)
    assert _rows(client, db, "SELECT host, usage FROM cpu") == expected
