"""What is persisted leaves the durable embedded broker's store (server/runtime/broker_truncation.py):
after a persist, every record batch below the checkpoint's start is deleted from the store, the
partition's last batch is kept, Kafka's earliest offset moves up to it, and a server SIGKILLed with
unpersisted writes on top recovers every acknowledged write exactly once from what is left.

Real processes: `iox serve` on its durable embedded broker (Tansu on its SeaweedFS store), the
store listed with boto3 as Tansu lays it out."""
from __future__ import annotations

import re
import urllib.request
import uuid

from confluent_kafka import Consumer, TopicPartition

from iox_spark.catalog.sharding import topic_for
from iox_spark.server.runtime.broker import free_port
from tests.crash.harness import ServerProcess, Writer, broker_record, stored_offsets
from tests.waiting import wait_for

DURABLE = ["--broker-storage", "durable"]


def _low_watermark(bootstrap: str, topic: str, kp: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "truncation-check", "log_level": 3})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, kp), timeout=30)[0]
    finally:
        c.close()


def _truncated_total(http_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30).read().decode()
    m = re.search(r"^iox_broker_store_truncated_batches_total (\S+)$", text, re.M)
    assert m, "the counter is exported"
    return float(m.group(1))


def test_persisted_batches_leave_the_store_and_a_killed_server_recovers_from_what_is_left(tmp_path):
    data_dir = str(tmp_path)
    db = f"trunc_{uuid.uuid4().hex[:6]}"
    topic = topic_for(db)
    http_port = free_port()
    s1 = ServerProcess(data_dir, extra=DURABLE + ["--http-port", str(http_port)]).wait_ready()
    try:
        w = Writer(db)
        for _ in range(12):
            assert w.write_batch(s1.client, 40)
        ends = {}
        for tok in w.tokens:
            for kp, off in tok.items():
                ends[int(kp)] = max(ends.get(int(kp), -1), off)
        assert ends, "the writes landed somewhere"
        written = {kp: stored_offsets(data_dir, topic, kp) for kp in ends}
        assert all(offs[-1] == ends[kp] and len(offs) >= 12 // len(ends) for kp, offs in written.items()), written
        s1.client.wait_applied(db, ends, timeout_s=120)
        s1.client.persist(db, timeout_s=180)
        # everything is persisted: only each partition's last batch stays (the watermark is read from it)
        wait_for(lambda: all(stored_offsets(data_dir, topic, kp) == [end] for kp, end in ends.items()), 60,
                 "the persisted batches deleted from the store")
        deleted = sum(len(offs) - 1 for offs in written.values())
        # the counter is raised once a truncation round's deletes of every partition are done
        wait_for(lambda: _truncated_total(http_port) == deleted, 30, f"the truncation counter at {deleted}")
        bootstrap = f"127.0.0.1:{broker_record(data_dir)['port']}"
        assert {kp: _low_watermark(bootstrap, topic, kp) for kp in ends} == ends
        # unpersisted writes on top, then a SIGKILL: the next server replays them from what is left
        for _ in range(5):
            assert w.write_batch(s1.client, 40)
    finally:
        s1.kill()
    s2 = ServerProcess(data_dir, extra=DURABLE).wait_ready()
    try:
        ids = w.check(s2.client)
        assert sorted(ids) == sorted(w.acked) and len(ids) == 17 * 40
    finally:
        s2.terminate()
