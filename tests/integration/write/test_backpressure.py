"""Bounded memory: over buffer_size_hard the consumer stops taking micro-batches and writes get
RESOURCE_EXHAUSTED (with a retry hint) until persist + unload bring memory back under; nothing
acknowledged is lost."""
from __future__ import annotations

import os
import threading
import time
import uuid

import grpc

from iox_spark.server.runtime.broker import start_broker
from iox_spark.server.api.client import IoxClient
from tests.conftest import make_config
from tests.timestamps import T0


def test_hard_limit_rejects_writes_until_memory_is_back_under(iox_server, session_tmp):
    from iox_spark.server.app import IoxServer

    broker = start_broker()
    cfg = make_config(os.path.join(session_tmp, f"bp-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      lifecycle={"worker_backoff_ms": 200, "buffer_size_soft_bytes": 1, "buffer_size_hard_bytes": 1,
                                 "late_arrive_window_s": 1.0})
    srv = IoxServer(cfg)
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    db = f"bp_{uuid.uuid4().hex[:6]}"
    acked, exhausted, stop = [], [], threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 2000:
            try:
                c.write(db, f"cpu,w=x id={i}i {T0 + i}\n")
                acked.append(i)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert "hard limit" in e.details()
                exhausted.append(i)
            i += 1
            time.sleep(0.02)

    try:
        t = threading.Thread(target=writer)
        t.start()
        deadline = time.monotonic() + 120
        while not exhausted or srv.lifecycle.backpressure_engaged:
            assert time.monotonic() < deadline, "backpressure never engaged and released"
            time.sleep(0.1)
        n_before = len(acked)
        while len(acked) < n_before + 5:  # writes are accepted again once memory is back under
            assert time.monotonic() < deadline
            time.sleep(0.1)
        stop.set()
        t.join()
        assert srv.lifecycle.backpressure_engagements >= 1
        c.wait_caught_up(db)
        deadline = time.monotonic() + 120
        while True:  # every acknowledged write becomes queryable (through persist + unload)
            rows = c.query(db, "SELECT id FROM cpu").to_pylist()
            if sorted(r["id"] for r in rows) == sorted(acked):
                break
            assert time.monotonic() < deadline, f"{len(rows)} rows for {len(acked)} acked writes"
            time.sleep(0.5)
        assert not set(exhausted) & {r["id"] for r in rows}  # rejected writes never reached Kafka
    finally:
        stop.set()
        c.close()
        srv.stop()
        broker.stop()


def test_a_micro_batch_takes_at_most_the_read_limit_of_each_kafka_partition(broker):
    """The source's default read limit caps every Kafka partition of a micro-batch at
    `max_messages_per_partition` messages; a backlog is read in steps, and ReadAllAvailable
    (Trigger.AvailableNow) still reads to the end."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from iox_spark.server.write_buffer.kafka_source import IoxKafkaStreamReader
    from iox_spark.server.write_buffer.producer import producer_conf

    # not an `iox.` topic: the session server's consumer would read these bare messages
    topic = f"readlimit.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    p = Producer(producer_conf(broker.bootstrap, 10_000))
    for i, kp in enumerate([0] * 7 + [1] * 2):  # one at a time: a batch each, so every watermark is exact
        p.produce(topic, value=b"x%d" % i, partition=kp)
        assert p.flush(30) == 0
    r = IoxKafkaStreamReader({"bootstrap": broker.bootstrap, "topic_prefix": topic, "max_messages_per_partition": "3"})
    try:
        limit = r.getDefaultReadLimit()
        start = r.initialOffset()
        assert start == {topic: {"0": 0, "1": 0}}
        first = r.latestOffset(start, limit)
        assert first == {topic: {"0": 3, "1": 2}}
        second = r.latestOffset(first, limit)
        assert second == {topic: {"0": 6, "1": 2}}
        assert r.latestOffset(second, limit) == {topic: {"0": 7, "1": 2}}
        assert r.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 7, "1": 2}}
    finally:
        r.stop()
