"""The streaming source's reads (server/write_buffer/kafka_source.py `read`, `true_ends`) and the replay's
schema read (server/consume/replay_schemas.py) on a partition holding transaction control records: a
transactional producer leaves a commit marker after each of its transactions, an offset that
holds no message. A range with markers in it, ending in one, or made of one only is read whole and
ends at once, with the real broker and librdkafka's consumer (Spark not needed). The topic is not
a database topic (prefix `iox.`), so the session's server never follows it."""
from __future__ import annotations

import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iox_spark.catalog.catalog import Database
from iox_spark.catalog.schema import Column
from iox_spark.server.write_buffer import kafka_source
from iox_spark.server.consume import replay_schemas
from iox_spark.server.write_buffer.kafka_source import IoxKafkaStreamReader, TopicPartitionRange, reader_consumer, true_ends
from iox_spark.server.write_buffer.wire_format import encode_write
from tests.timestamps import T0


def _write(n: int):
    data = pa.table({"v": pa.array([float(i) for i in range(n)], pa.float64()),
                     "time": pa.array([T0 + i for i in range(n)], pa.int64())})
    return encode_write("cpu", [Column("v", "field", "float"), Column("time", "time", "time")], data)


@pytest.fixture
def marked_topic(broker):
    """(topic, {offset: rows} of its messages, high watermark): one partition where 3 transactions
    of 1, 2 and 1 messages each end with a commit marker, the last offset being one."""
    topic = f"gaps.{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic, "log_level": 3})
    p.init_transactions(30)
    acked: dict[int, int] = {}
    for rows in ([1], [2, 3], [4]):
        p.begin_transaction()
        for n in rows:
            w = _write(n)
            p.produce(topic, value=w.value, headers=w.headers, partition=0,
                      on_delivery=lambda err, m, n=n: acked.__setitem__(m.offset(), n))
        p.commit_transaction(30)
    c = reader_consumer(broker.bootstrap)
    try:
        _lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()
    assert len(acked) == 4 and hi > max(acked) + 1  # a marker after the last message
    yield topic, acked, hi


@pytest.fixture
def reader(broker, monkeypatch):
    monkeypatch.setattr(kafka_source, "_idle_consumers", {})
    # a read that does not end on the broker's word sits out one of these: far longer than one that does,
    # however loaded the host (a stalled range fails in 30 s, not 60)
    monkeypatch.setattr(kafka_source, "READ_STALL_TIMEOUT_S", 30.0)
    monkeypatch.setattr(kafka_source, "SLOW_LIST_SWITCH_S", 20.0)
    r = IoxKafkaStreamReader({"bootstrap": broker.bootstrap})
    yield r
    for c, _since in kafka_source._idle_consumers.values():
        c.close()


#: a read or probe that ended on the broker's word, not by waiting one of the waits above out
_ENDED_AT_ONCE_S = 10.0


def _read(reader, topic: str, start: int, end_exclusive: int) -> tuple[list[int], list[int], float]:
    t0 = time.monotonic()
    batches = list(reader.read(TopicPartitionRange(topic, 0, start, end_exclusive)))
    took = time.monotonic() - t0
    t = pa.Table.from_batches(batches) if batches else None
    return ([] if t is None else t.column("offset").to_pylist(),
            [] if t is None else t.column("nrows").to_pylist(), took)


def test_ranges_with_control_records_are_read_whole_and_end_at_once(reader, marked_topic):
    topic, acked, hi = marked_topic
    offsets = sorted(acked)
    # the whole partition, ending in a marker; then again with the consumer the first read left idle
    for _ in range(2):
        got, rows, took = _read(reader, topic, 0, hi)
        assert got == offsets and rows == [acked[o] for o in offsets]
        assert took < _ENDED_AT_ONCE_S
    # a range that starts at a marker, one that ends at the first, one of the last marker only
    assert _read(reader, topic, offsets[0] + 1, hi)[0] == offsets[1:]
    assert _read(reader, topic, 0, offsets[0] + 2)[0] == offsets[:1]
    got, _rows, took = _read(reader, topic, hi - 1, hi)
    assert got == [] and took < _ENDED_AT_ONCE_S


def test_true_ends_of_a_partition_ending_in_a_control_record_does_not_wait_for_a_message(broker, marked_topic):
    topic, _acked, hi = marked_topic
    c = reader_consumer(broker.bootstrap)
    try:
        t0 = time.monotonic()
        # the probe would give a partition it never hears from its whole wait
        assert true_ends(c, topic, {0: hi}, wait_s=2 * _ENDED_AT_ONCE_S) == {0: hi}
        assert time.monotonic() - t0 < _ENDED_AT_ONCE_S
    finally:
        c.close()


def test_replay_schemas_reads_a_range_ending_in_a_control_record(broker, marked_topic, monkeypatch):
    topic, acked, hi = marked_topic
    monkeypatch.setattr(replay_schemas, "READ_STALL_TIMEOUT_S", 10.0)
    db = Database(name="gaps", topic=topic, kafka_partitions=1)
    t0 = time.monotonic()
    assert replay_schemas.load_replay_schemas(broker.bootstrap, db, {0: 0}, {0: hi - 1}) == len(acked)
    assert time.monotonic() - t0 < 2.0
    assert db.schemas.get("cpu").get("v").type == "float"
    # a replay range of the last marker only (everything before it applied)
    assert replay_schemas.load_replay_schemas(broker.bootstrap, db, {0: hi - 1}, {0: hi - 1}) == 0
