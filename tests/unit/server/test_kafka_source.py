"""The streaming source's Kafka reads (server/kafka_source.py) against a recording consumer with
librdkafka's `consume` contract: a call returns once it has `num_messages` messages or when its
timeout ends. A call asking for more messages than will come waits out its whole timeout, so the
source must never ask for more than its range still holds (nor, probing ends, for more than the
next message while waiting). The real consumer is exercised by the integration tests."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from catalog.schema import Column
from server import kafka_source
from server.kafka_source import IoxKafkaStreamReader, _TopicPartitionRange, true_ends
from server.wire_format import encode_write

TOPIC = "iox.db"
T0 = 1_700_000_000_000_000_000


class _Msg:
    def __init__(self, partition: int, offset: int, value: bytes = b"", headers=None):
        self._p, self._o, self._v, self._h = partition, offset, value, headers or []

    def error(self):
        return None

    def topic(self):
        return TOPIC

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def value(self):
        return self._v

    def headers(self):
        return self._h

    def timestamp(self):
        return (1, 1_700_000_000_000)


class _Consumer:
    """Holds {partition: [messages]}; `consume` hands out what is assigned, in order, and records
    (num_messages, timeout, how many it returned): fewer returned than asked with a timeout > 0
    is a call that would have waited out its timeout."""

    def __init__(self, log: dict[int, list[_Msg]]):
        self.log = log
        self.queue: list[_Msg] = []
        self.calls: list[tuple[int, float, int]] = []
        self.closed = False

    def assign(self, tps):
        self.queue = [m for tp in tps for m in self.log[tp.partition] if m.offset() >= tp.offset]

    def unassign(self):
        self.queue = []

    def close(self):
        self.closed = True

    def consume(self, num_messages=1, timeout=-1):
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        self.calls.append((num_messages, timeout, len(out)))
        return out

    def waited_out(self):
        return [c for c in self.calls if c[1] > 0 and c[2] < c[0]]


def _write(table: str, n: int, field: str = "v", typ: str = "float"):
    """A write-buffer message of `n` rows of `table`: one field column of `typ` (float or integer)."""
    arrow = {"float": pa.float64(), "integer": pa.int64()}[typ]
    data = pa.table({field: pa.array(range(n), arrow), "time": pa.array([T0 + i for i in range(n)], pa.int64())})
    return encode_write(table, [Column(field, "field", typ), Column("time", "time", "time")], data)


@pytest.fixture
def reader(monkeypatch):
    r = IoxKafkaStreamReader({"bootstrap": "fake:9092"})
    monkeypatch.setattr(kafka_source, "_idle_consumers", {})
    return r


@pytest.mark.parametrize("end_exclusive", [1, 3, 7])
def test_read_asks_for_no_more_messages_than_its_range_holds(reader, end_exclusive):
    w = _write("cpu", 4)
    c = _Consumer({2: [_Msg(2, off, w.value, w.headers) for off in range(10)]})
    kafka_source._idle_consumers["fake:9092"] = (c, time.monotonic())
    batches = list(reader.read(_TopicPartitionRange(TOPIC, 2, 0, end_exclusive)))
    t = pa.Table.from_batches(batches)
    assert t.column("offset").to_pylist() == list(range(end_exclusive))
    assert t.column("nrows").to_pylist() == [4] * end_exclusive
    assert t.column("problem").to_pylist() == [None] * end_exclusive
    assert c.waited_out() == []
    assert [n for n, _t, _got in c.calls] == [end_exclusive]
    assert kafka_source._idle_consumers["fake:9092"][0] is c  # kept for the worker's next task


def test_read_of_a_range_larger_than_one_consume_call_asks_for_what_is_left(reader):
    w = _write("cpu", 1)
    c = _Consumer({0: [_Msg(0, off, w.value, w.headers) for off in range(1_200)]})
    kafka_source._idle_consumers["fake:9092"] = (c, time.monotonic())
    rows = sum(b.num_rows for b in reader.read(_TopicPartitionRange(TOPIC, 0, 100, 1_150)))
    assert rows == 1_050
    assert [n for n, _t, _got in c.calls] == [500, 500, 50]
    assert c.waited_out() == []


def test_a_consumer_idle_for_too_long_is_closed_by_the_next_task_whatever_broker_it_reads(reader, monkeypatch):
    # a worker once read a broker that is gone: its idle consumer must not reconnect to it forever
    w = _write("cpu", 1)
    gone, recent, stale = _Consumer({}), _Consumer({}), _Consumer({})
    created: list[tuple[str, _Consumer]] = []

    def new_consumer(bootstrap):
        created.append((bootstrap, _Consumer({0: [_Msg(0, 0, w.value, w.headers)]})))
        return created[-1][1]

    monkeypatch.setattr(kafka_source, "reader_consumer", new_consumer)
    now = time.monotonic()
    kafka_source._idle_consumers.update({
        "gone:9092": (gone, now - kafka_source.IDLE_CONSUMER_MAX_S - 1),
        "recent:9092": (recent, now - kafka_source.IDLE_CONSUMER_MAX_S + 30),
        "fake:9092": (stale, now - kafka_source.IDLE_CONSUMER_MAX_S - 1)})
    assert sum(b.num_rows for b in reader.read(_TopicPartitionRange(TOPIC, 0, 0, 1))) == 1
    assert gone.closed and "gone:9092" not in kafka_source._idle_consumers
    assert not recent.closed and kafka_source._idle_consumers["recent:9092"][0] is recent
    # the task's own broker's idle consumer was as old: closed too, and the task read with a new one,
    # now the idle one of its broker
    assert stale.closed and stale.calls == []
    assert [b for b, _c in created] == ["fake:9092"]
    assert kafka_source._idle_consumers["fake:9092"][0] is created[0][1] and not created[0][1].closed


def test_true_ends_reads_each_last_batch_without_waiting_out_a_timeout():
    # Tansu's watermark is the last batch's base offset + 1: partition 0's last batch holds 5-7,
    # partition 1's is one message at 3, partition 2 is empty
    c = _Consumer({0: [_Msg(0, off) for off in range(8)], 1: [_Msg(1, off) for off in range(4)], 2: []})
    assert true_ends(c, TOPIC, {0: 6, 1: 4, 2: 0}) == {0: 8, 1: 4, 2: 0}
    assert c.waited_out() == []
    assert c.queue == []  # unassigned
