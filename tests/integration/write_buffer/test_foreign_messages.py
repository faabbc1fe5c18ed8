"""Messages on a database's topic that the server cannot read are skipped, logged and counted.

A foreign producer on an `iox.*` topic, or headers an iox server could never
have written, must not stop ingestion (the stream would fail on every restart,
and no later write would ever become queryable). IOx skips write-buffer entries
it cannot decode; so does the consumer (server/write_buffer/wire_format.py header_problem),
advancing past them. Real broker, real server.
"""
from __future__ import annotations

import json
import logging

import pyarrow as pa
from confluent_kafka import Producer

from iox_spark.catalog.sharding import partition_for, topic_for
from tests.integration.foreign_messages import PARTITIONS, applied_rows, ipc, produce, write_headers
from tests.timestamps import T0


def test_unreadable_messages_are_skipped_logged_and_counted(client, db, iox_server, caplog):
    first = client.write(db, f"cpu,host=a v=1 {T0}\n")
    client.wait_applied(db, first, timeout_s=60)
    restarts = iox_server.consumer.restarts
    kp = partition_for("cpu", PARTITIONS)
    bad = [
        (b"hello from another producer", []),
        (b"", [("iox-format", b"2"), ("iox-kind", b"upsert")]),
        (b"{}", [("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", b"not json"),
                 ("iox-rows", b"many")]),
        (b"DELETE everything", [("iox-format", b"2"), ("iox-kind", b"delete"), ("iox-table", b"cpu")]),
        (b"\x00\x01", [("iox-format", None), ("iox-kind", b"\xffwrite")]),
        # a delete of every row, but not from an iox server: never applied, also when a real
        # delete is read in the same micro-batch
        (json.dumps({"table": "cpu", "start_ns": 0, "stop_ns_exclusive": 2 ** 62, "predicate": []}).encode(),
         [("iox-kind", b"delete"), ("iox-table", b"cpu")]),
        # iox headers, but a payload that is not Arrow, or rows without their time
        (b"garbage", write_headers(1)),
        (ipc(pa.table({"host": ["c"], "v": [3.0]})), write_headers(1)),
    ]
    with caplog.at_level(logging.WARNING, logger="iox_spark.server.consume.ingest"):
        offsets = produce(iox_server.bootstrap, topic_for(db), kp, bad)
        client.delete(db, 0, 2 ** 62, predicate="host = 'nobody'", table="cpu")
        second = client.write(db, f"cpu,host=b v=2 {T0 + 1}\n")
        assert second[kp] > offsets[-1]
        client.wait_applied(db, second, timeout_s=60)

    assert client.query(db, "SELECT host, v, time_ns FROM cpu ORDER BY host").to_pylist() == [
        {"host": "a", "v": 1.0, "time_ns": T0}, {"host": "b", "v": 2.0, "time_ns": T0 + 1}]
    assert iox_server.consumer.restarts == restarts
    st = client.status(db)["databases"][0]
    assert [{k: int(v) if k in ("count", "last_offset") else v for k, v in s.items()}
            for s in st["skipped_messages"]] == [
        {"partition": kp, "count": 8, "last_offset": offsets[-1],
         "last_reason": "payload without an int64 time column"}]
    # Arrow's own words for the undecodable payload are cut (they vary with its version)
    skipped = sorted(r.getMessage().split(" (ArrowInvalid: ")[0] for r in caplog.records
                     if "skipped write-buffer message" in r.getMessage())
    topic = topic_for(db)
    assert skipped == sorted([
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[0]}: "
        "no iox-format header (not written by an iox server)",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[1]}: unknown iox-kind 'upsert'",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[2]}: "
        "write with iox-schema 'not json' (expected [[name, role, type], ...])",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[3]}: "
        "delete whose value is not a delete (JSONDecodeError: Expecting value: line 1 column 1 (char 0))",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[4]}: "
        "no iox-format header (not written by an iox server)",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[5]}: "
        "no iox-format header (not written by an iox server)",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[6]}: "
        "payload is not an Arrow IPC stream",
        f"database {db}: skipped write-buffer message {topic}[{kp}]@{offsets[7]}: payload without an int64 time column",
    ])
    # the chunks hold exactly the readable rows (counted, not taken from the skipped messages' headers)
    tables = {t["name"]: t for t in st["tables"]}
    assert sum(int(c["rows"]) for p in tables["cpu"]["partitions"] for c in p["chunks"]) == 2


def test_another_producers_batch_of_several_writes_is_applied_to_its_last_message(client, db, iox_server):
    """Tansu reports a partition's high watermark as the base offset of its last record batch + 1.
    A batch of several writes from another producer, with nothing written after it, must still be
    applied whole: the source reads the last batch for the true end once the partition stops moving."""
    from confluent_kafka import TopicPartition

    from iox_spark.server.write_buffer.kafka_source import reader_consumer
    from tests.waiting import wait_for

    first = client.write(db, f"cpu,host=a v=1 {T0}\n")
    client.wait_applied(db, first, timeout_s=60)
    kp = partition_for("cpu", PARTITIONS)
    msgs = [(ipc(pa.table({"host": [f"f{i}"], "v": [float(i)], "time": pa.array([T0 + 1 + i], pa.int64())})),
             write_headers(1)) for i in range(5)]
    p = Producer({"bootstrap.servers": iox_server.bootstrap, "acks": "all", "linger.ms": 500, "log_level": 3})
    offsets = []
    for value, headers in msgs:
        p.produce(topic_for(db), value=value, key=b"foreign", headers=headers, partition=kp,
                  on_delivery=lambda err, m: offsets.append(m.offset()) if err is None else None)
    assert p.flush(30) == 0 and len(offsets) == 5
    c = reader_consumer(iox_server.bootstrap)
    try:
        _lo, hi = c.get_watermark_offsets(TopicPartition(topic_for(db), kp), timeout=10)
    finally:
        c.close()
    assert hi == min(offsets) + 1, "the five writes were not one record batch: the case is not staged"

    wait_for(lambda: applied_rows(client, db) == 6, 60, "the batch's five writes applied")
    assert client.query(db, "SELECT host FROM cpu ORDER BY host").to_pylist() == [
        {"host": h} for h in ("a", "f0", "f1", "f2", "f3", "f4")]
    assert client.status(db)["databases"][0].get("skipped_messages", []) == []
