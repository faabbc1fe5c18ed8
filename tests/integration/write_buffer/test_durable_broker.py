"""The durable embedded broker (Tansu on its SeaweedFS store, server/runtime/broker.py): a SIGKILL of
the broker (and of its store) between produces loses and overwrites no acknowledged message,
concurrent idempotent producers on one partition each get offsets of their own, and the store leaves
no file in /tmp."""
import glob
import os
import signal
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iox_spark.server.runtime import broker

TOPIC = "durable"


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 1,
                     "allow.auto.create.topics": False, "message.timeout.ms": 60000})


def _produce(bootstrap: str, values: list[bytes]) -> dict[int, bytes]:
    """Produces `values` to partition 0, one at a time; returns offset -> value of the acknowledged ones."""
    p = _producer(bootstrap)
    acked, errors = {}, []

    def done(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[msg.offset()] = msg.value()

    for v in values:
        p.produce(TOPIC, v, partition=0, on_delivery=done)
        p.flush(60)
    assert not errors, errors
    assert len(acked) == len(values)
    return acked


def _read_all(bootstrap: str, expect: int) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    got, deadline = [], time.monotonic() + 60
    try:
        while len(got) < expect and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    got.append((m.offset(), m.value()))
        end = time.monotonic() + 1.5  # nothing more than expected
        while time.monotonic() < end:
            got += [(m.offset(), m.value()) for m in c.consume(500, 0.3) if m.error() is None]
    finally:
        c.close()
    return got


def _watermark(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "log_level": 3})
    try:
        return c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)[1]
    finally:
        c.close()


def _create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
        f.result(30)


@pytest.fixture
def durable(tmp_path):
    handles = []

    def start():
        h = broker.start_or_reuse(str(tmp_path), storage=broker.STORAGE_DURABLE)
        handles.append(h)
        return h

    yield start
    for h in handles:
        for pid in (h.pid, h.store_pid):
            if pid and broker.process_alive(pid):
                broker._stop_process(pid, signal.SIGKILL)
    broker.remove_left_sockets(str(tmp_path / "broker-store"))  # what SIGKILLed stores leave in /tmp


@pytest.mark.parametrize("kill_store", [False, True], ids=["broker", "broker-and-store"])
def test_a_killed_durable_broker_keeps_every_acknowledged_offset_and_continues_them(durable, kill_store):
    h = durable()
    _create_topic(h.bootstrap)
    acked = _produce(h.bootstrap, [b"a%d" % i for i in range(10)])
    for round_ in range(2):
        os.kill(h.pid, signal.SIGKILL)
        if kill_store:
            os.kill(h.store_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while broker.process_alive(h.pid) and time.monotonic() < deadline:
            broker._reap(h.pid)
            time.sleep(0.05)
        h = durable()
        assert h.owned  # started again on the same store
        new = _produce(h.bootstrap, [b"r%d-%d" % (round_, i) for i in range(5)])
        assert min(new) == max(acked) + 1, (sorted(acked), sorted(new))  # the offsets continue
        acked.update(new)
    got = _read_all(h.bootstrap, len(acked))
    assert dict(got) == acked  # every acknowledged message, with its value, at its offset
    assert len(got) == len(acked)  # and once


def test_the_store_leaves_no_socket_or_log_file_in_tmp(durable, tmp_path):
    """SeaweedFS makes unix sockets named after its ports in /tmp, and its log files go there unless
    it is given a directory: a stop, and the start after a crash, remove every socket the store left
    there; its log files are in its own directory."""
    def in_tmp():
        return set(glob.glob("/tmp/seaweedfs-*.sock")) | set(glob.glob("/tmp/weed.*"))

    before = in_tmp()  # other processes' (their stores may add more meanwhile, named by ports of their own)
    store_dir = str(tmp_path / "broker-store")
    h = durable()
    used, pids = [broker._recorded_store_ports(store_dir)], [h.store_pid]
    for pid in (h.pid, h.store_pid):  # a crash: the sockets stay until the next start
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while broker.process_alive(pid) and time.monotonic() < deadline:
            broker._reap(pid)
            time.sleep(0.05)
    h = durable()
    used.append(broker._recorded_store_ports(store_dir))
    pids.append(h.store_pid)
    broker.store_client(h.store_port).head_bucket(Bucket=broker.STORE_BUCKET)
    h.stop()
    assert None not in used
    ports = {p + off for u in used for p in u.values() for off in (0, broker._GRPC_PORT_OFFSET)}
    new = in_tmp() - before
    assert sorted(f for f in new if f.endswith(tuple(f"-{p}.sock" for p in ports))) == []
    assert sorted(f for f in new if f.endswith(tuple(f".{pid}" for pid in pids))) == []
    assert [f for u in used for f in broker._store_sockets(store_dir, u) if os.path.exists(f)] == []
    assert all(glob.glob(f"{store_dir}/log/weed.*.{pid}") for pid in pids)  # its log files: in its directory


def test_concurrent_idempotent_producers_on_one_partition_each_keep_their_offsets(durable):
    h = durable()
    _create_topic(h.bootstrap)
    results, n = [None] * 3, 40

    def run(k):
        p = _producer(h.bootstrap)
        acked = []

        def done(err, msg):
            if err is None:
                acked.append((msg.offset(), msg.value()))

        for i in range(n):
            p.produce(TOPIC, b"p%d-%d" % (k, i), partition=0, on_delivery=done)
            p.poll(0)
            if i % 8 == 7:
                p.flush(60)
        p.flush(60)
        results[k] = acked

    threads = [threading.Thread(target=run, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    acked = [a for r in results for a in r]
    assert len(acked) == 3 * n
    assert len({o for o, _ in acked}) == len(acked), "two acknowledged messages share an offset"
    got = _read_all(h.bootstrap, len(acked))
    assert sorted(got) == sorted(acked)  # each present exactly once, at its acknowledged offset
    assert sorted(v for _, v in got) == sorted(b"p%d-%d" % (k, i) for k in range(3) for i in range(n))


def test_an_exact_end_is_the_partitions_own_when_listoffsets_is_short_by_many_batches(durable):
    """Tansu on s3:// storage answers ListOffsets latest with the first batch stored in the last
    second of the store's clock: the end `true_ends` confirms is the partition's (the fetch's own
    high watermark), whatever watermark it started from."""
    from iox_spark.server.write_buffer.kafka_source import reader_consumer, true_ends

    h = durable()
    _create_topic(h.bootstrap)
    acked = _produce(h.bootstrap, [b"m%d" % i for i in range(30)])  # single-message batches
    assert sorted(acked) == list(range(30))
    c = reader_consumer(h.bootstrap)
    try:
        _lo, listed = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        assert 0 < listed <= 30
        for start in (1, 15, listed):  # as short as ListOffsets can be, and what it said now
            assert true_ends(c, TOPIC, {0: start}, wait_s=10, exact=True) == {0: 30}
    finally:
        c.close()


def test_a_partition_holding_more_batches_than_a_short_fetch_lists_is_read_to_its_end(durable, monkeypatch):
    """Tansu's object-store engine stops listing a partition's batches when a fetch's wait runs out and
    then answers nothing: the reader's 20 ms fetches never reach the end of 3,000 stored batches. The
    exact end (`true_ends`, `partition_bounds`) and the streaming source's `read` use consumers that may
    wait LIST_FETCH_WAIT_MS, and reach it."""
    from iox_spark.server.write_buffer import kafka_source
    from iox_spark.server.write_buffer.kafka_source import IoxKafkaStreamReader, TopicPartitionRange

    monkeypatch.setattr(kafka_source, "_idle_consumers", {})
    monkeypatch.setattr(kafka_source, "READ_STALL_TIMEOUT_S", 30.0)
    h = durable()
    _create_topic(h.bootstrap)
    n = 3000
    p = Producer({"bootstrap.servers": h.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "batch.num.messages": 1, "log_level": 3})  # one message per stored batch: 3,000 batches
    for i in range(n):
        p.produce(TOPIC, b"m%d" % i, partition=0)
        p.poll(0)
    assert p.flush(120) == 0
    short = kafka_source.reader_consumer(h.bootstrap)
    try:  # what the reader's own fetches reach: nothing at the end of the partition
        short.assign([TopicPartition(TOPIC, 0, n - 200)])
        assert [m for m in short.consume(10, 3.0) if m.error() is None] == []
    finally:
        short.close()
    # the end: the watermark Tansu lists may be short of it; the last batch is read to find it
    hw = _watermark(h.bootstrap)
    long = kafka_source.reader_consumer(h.bootstrap, **{"fetch.wait.max.ms": kafka_source.LIST_FETCH_WAIT_MS})
    try:
        assert kafka_source.true_ends(long, TOPIC, {0: hw}, exact=True) == {0: n}
        t0 = time.monotonic()
    finally:
        long.close()
    assert time.monotonic() - t0 < 1.0  # closing does not wait out the fetch at the partition's end
    from iox_spark.server.write_buffer.producer import WriteBuffer

    wb = WriteBuffer(h.bootstrap, 1, 10_000)
    try:  # the exact end recovery and the read barrier take (WriteBufferUnavailable when not confirmed)
        assert wb.partition_bounds(TOPIC, 1) == {0: (0, n)}
    finally:
        wb.close()
    reader = IoxKafkaStreamReader({"bootstrap": h.bootstrap})
    batches = list(reader.read(TopicPartitionRange(TOPIC, 0, n - 200, n)))
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(n - 200, n))
    assert kafka_source._idle_consumers == {}  # the long-waiting consumer is not kept for the next task
