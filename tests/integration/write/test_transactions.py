"""Multi-message write requests are transactions (catalog/transactions.py), on the real broker and server.

A request whose tables live on several Kafka partitions becomes parts, one commit
decision on the highest partition and markers; the consumer applies all of it or
none. The failure cases are staged by producing the messages a dying router would
have left behind (parts only; parts and decision only) straight to Kafka; the
SIGKILL versions are in tests/crash.
"""
from __future__ import annotations

import dataclasses
import json
import time

import pyarrow as pa
from confluent_kafka import Producer

from iox_spark.catalog.schema import Column
from iox_spark.server.write_buffer.kafka_source import reader_consumer
from iox_spark.server.write_buffer.wire_format import as_part, encode_decision, encode_write
from iox_spark.catalog.sharding import partition_for, topic_for
from tests.waiting import wait_for
from tests.timestamps import T0

PARTITIONS = 4


def _tables_on_distinct_partitions(prefix: str, n: int) -> list[str]:
    out, seen, i = [], set(), 0
    while len(out) < n:
        name = f"{prefix}{i}"
        kp = partition_for(name, PARTITIONS)
        if kp not in seen:
            seen.add(kp)
            out.append(name)
        i += 1
    return out


def _messages(bootstrap: str, topic: str) -> list[dict]:
    """Every message of the topic: kp, offset, kind, txn, info (decoded iox-txn-info)."""
    from confluent_kafka import TopicPartition

    c = reader_consumer(bootstrap)
    out = []
    try:
        for kp in range(PARTITIONS):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, kp), timeout=10)
            if hi <= lo:
                continue
            c.assign([TopicPartition(topic, kp, lo)])
            deadline = time.monotonic() + 10
            last = -1
            while time.monotonic() < deadline:
                for m in c.consume(500, timeout=0.2):
                    if m.error() is None:
                        h = dict(m.headers() or [])
                        out.append({"kp": kp, "offset": m.offset(), "kind": h["iox-kind"].decode(),
                                    "txn": h.get("iox-txn", b"").decode(),
                                    "info": json.loads(h.get("iox-txn-info", b"{}") or b"{}")})
                        last = m.offset()
                if last >= hi - 1:
                    break
            c.unassign()
    finally:
        c.close()
    return out


def _produce(bootstrap: str, topic: str, msgs, timestamp_ms: int | None = None) -> list[tuple[int, int]]:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "log_level": 3})
    acked = [None] * len(msgs)

    def cb(i):
        def on(err, m):
            assert err is None, err
            acked[i] = (m.partition(), m.offset())
        return on

    for i, w in enumerate(msgs):
        kp = w.partition if w.partition is not None else partition_for(w.table, PARTITIONS)
        kw = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        p.produce(topic, value=w.value, key=w.key, headers=w.headers, partition=kp, on_delivery=cb(i), **kw)
    assert p.flush(30) == 0
    return acked


def _write(table: str, values: list[float]):
    data = pa.table({"host": pa.array(["a"] * len(values)), "v": pa.array(values, pa.float64()),
                     "time": pa.array([T0 + i for i in range(len(values))], pa.int64())})
    return encode_write(table, [Column("host", "tag", "string"), Column("v", "field", "float"),
                                Column("time", "time", "time")], data)


def _db_status(client, db) -> dict:
    return client.status(db)["databases"][0]


def test_request_spanning_partitions_is_parts_a_commit_and_markers(client, db, iox_server):
    tables = _tables_on_distinct_partitions("m", 3)
    lp = "\n".join(f"{t},host=h{i} v={i}i {T0 + i}" for t in tables for i in range(5))
    token = client.write(db, lp)
    client.wait_applied(db, token, timeout_s=60)
    for t in tables:
        assert client.query(db, f"SELECT host, v FROM {t} ORDER BY host").to_pylist() == \
            [{"host": f"h{i}", "v": i} for i in range(5)]
    msgs = _messages(iox_server.bootstrap, topic_for(db))
    kps = sorted(partition_for(t, PARTITIONS) for t in tables)
    parts = [m for m in msgs if m["kind"] == "part"]
    decisions = [m for m in msgs if m["kind"] == "decision"]
    markers = [m for m in msgs if m["kind"] == "marker"]
    assert sorted(m["kp"] for m in parts) == kps
    assert len(decisions) == 1 and decisions[0]["kp"] == kps[-1] and decisions[0]["info"]["decision"] == "commit"
    assert sorted(map(tuple, decisions[0]["info"]["parts"])) == sorted((m["kp"], m["offset"]) for m in parts)
    # one commit marker on every other partition of a part; the consumer writes the markers too when
    # they have not reached it marker_repair_s after the decision (a micro-batch that lags under load),
    # so a partition may hold the router's and the consumer's: both commit, and the first decides
    assert sorted({m["kp"] for m in markers}) == kps[:-1]
    assert {m["info"]["decision"] for m in markers} == {"commit"}
    assert {m["txn"] for m in parts + decisions + markers} == {decisions[0]["txn"]}
    assert not [m for m in msgs if m["kind"] == "write"]  # nothing of the request bypassed the transaction
    st = _db_status(client, db)
    assert st.get("pending_transaction_parts", 0) == 0 and st.get("pinned_transactions", 0) == 0
    # a single-table request stays one plain message
    client.wait_applied(db, client.write(db, f"{tables[0]},host=z v=9i {T0}"), timeout_s=60)
    assert [m["kind"] for m in _messages(iox_server.bootstrap, topic_for(db)) if m["kind"] == "write"] == ["write"]


def test_parts_without_a_decision_are_aborted_and_never_applied(client, db, iox_server):
    """A router that died after producing the parts: once the parts are older than the
    transaction timeout, the consumer writes an abort decision and markers; nothing of the
    request is ever visible, and the partitions are not held back for good."""
    client.wait_applied(db, client.write(db, f"seed,host=a v=1 {T0}"), timeout_s=60)  # creates the topic
    topic = topic_for(db)
    a, b = _tables_on_distinct_partitions("orphan", 2)
    q = max(partition_for(a, PARTITIONS), partition_for(b, PARTITIONS))
    old_ms = int(time.time() * 1000) - 3_600_000  # an hour ago: past any transaction timeout
    parts = _produce(iox_server.bootstrap, topic, [as_part(_write(a, [1.0, 2.0]), "deadbeef", q),
                                                   as_part(_write(b, [3.0]), "deadbeef", q)], timestamp_ms=old_ms)
    after = client.write(db, f"seed,host=b v=2 {T0}")
    client.wait_applied(db, after, timeout_s=60)

    def aborted():
        ms = _messages(iox_server.bootstrap, topic)
        return [m for m in ms if m["kind"] in ("decision", "marker") and m["txn"] == "deadbeef"]

    wait_for(lambda: {m["kind"] for m in aborted()} == {"decision", "marker"}, 60,
             "the consumer's abort decision and marker")
    ctl = aborted()
    assert {(m["kind"], m["kp"], m["info"]["decision"]) for m in ctl} == \
        {("decision", q, "abort"), ("marker", min(kp for kp, _ in parts), "abort")}
    wait_for(lambda: _db_status(client, db).get("pending_transaction_parts", 0) == 0, 60, "the parts to be dropped")
    st = _db_status(client, db)
    assert [t["name"] for t in st["tables"]] == ["seed"]
    assert client.query(db, "SELECT host, v FROM seed ORDER BY host").to_pylist() == \
        [{"host": "a", "v": 1.0}, {"host": "b", "v": 2.0}]
    # the database checkpoint is no longer held below the parts
    assert iox_server.catalog.database(db).txns.pinned_offsets() == {}


def test_a_commit_without_markers_is_completed_by_the_consumer(client, db, iox_server):
    """A router that died after its commit decision was acknowledged (the client may have
    seen an error): the decision stands, the consumer writes the missing markers, and every
    table of the request appears."""
    client.wait_applied(db, client.write(db, f"seed,host=a v=1 {T0}"), timeout_s=60)
    topic = topic_for(db)
    a, b, c = _tables_on_distinct_partitions("committed", 3)
    q = max(partition_for(t, PARTITIONS) for t in (a, b, c))
    parts = _produce(iox_server.bootstrap, topic, [as_part(_write(t, [float(i), float(i + 10)]), "cafe", q)
                                                   for i, t in enumerate((a, b, c))])
    _produce(iox_server.bootstrap, topic, [encode_decision("cafe", "commit", parts, q)])

    def visible():
        try:
            return all(client.query(db, f"SELECT count(*) AS n FROM {t}").to_pylist() == [{"n": 2}] for t in (a, b, c))
        except Exception:
            return False

    wait_for(visible, 60, "the committed parts to appear")
    for i, t in enumerate((a, b, c)):
        assert client.query(db, f"SELECT v FROM {t} ORDER BY v").to_pylist() == [{"v": float(i)}, {"v": float(i + 10)}]
    markers = [m for m in _messages(iox_server.bootstrap, topic) if m["kind"] == "marker" and m["txn"] == "cafe"]
    # (a repair may be written twice when a batch is slow: only the first marker counts)
    assert {m["kp"] for m in markers} == {kp for kp, _ in parts} - {q}
    assert all(m["info"]["decision"] == "commit" for m in markers)
    wait_for(lambda: iox_server.catalog.database(db).txns.is_idle(), 30, "the transaction to settle")


def test_tables_sharing_one_partition_commit_without_markers(client, db, iox_server):
    names, i = [], 0
    while len(names) < 2:  # two tables on the same Kafka partition
        name = f"same{i}"
        if not names or partition_for(name, PARTITIONS) == partition_for(names[0], PARTITIONS):
            names.append(name)
        i += 1
    kp = partition_for(names[0], PARTITIONS)
    token = client.write(db, "\n".join(f"{t},host=a v=1i {T0}" for t in names))
    client.wait_applied(db, token, timeout_s=60)
    msgs = _messages(iox_server.bootstrap, topic_for(db))
    assert [(m["kind"], m["kp"]) for m in msgs] == [("part", kp), ("part", kp), ("decision", kp)]
    assert {int(k): v for k, v in token.items()} == {kp: msgs[-1]["offset"]}
    for t in names:
        assert client.query(db, f"SELECT v FROM {t}").to_pylist() == [{"v": 1}]


def test_the_first_decision_of_a_transaction_is_read_from_kafka(broker):
    """`WriteBuffer.first_decision` (a pool member whose part waits on another member's coordinator
    partition): the FIRST decision of the transaction on that partition, past other writes and other
    transactions' decisions; None while it has none."""
    from iox_spark.server.write_buffer.producer import WriteBuffer

    db = f"firstdec{time.monotonic_ns()}"
    wb = WriteBuffer(broker.bootstrap, PARTITIONS, 5000)
    try:
        topic = wb.ensure_topic(db)
        since_ms = int(time.time() * 1000)
        assert wb.first_decision(topic, 1, "tx", since_ms) is None  # an empty partition
        w = dataclasses.replace(_write("m", [1.0]), partition=1)
        wb._send_all(topic, [w, encode_decision("other", "abort", [], 1)])
        assert wb.first_decision(topic, 1, "tx", since_ms) is None  # no decision of this one yet
        wb._send_all(topic, [encode_decision("tx", "commit", [(0, 3)], 1), w,
                             encode_decision("tx", "abort", [], 1)])  # a later repair abort: ignored
        assert wb.first_decision(topic, 1, "tx", since_ms) == "commit"
        assert wb.first_decision(topic, 1, "other", since_ms) == "abort"
        assert wb.first_decision(topic, 2, "tx", since_ms) is None  # another partition holds none
    finally:
        wb.close()
