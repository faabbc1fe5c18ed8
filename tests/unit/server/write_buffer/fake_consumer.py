"""A recording Kafka consumer with librdkafka's `consume` and `position` contracts, and the
write-buffer messages it holds: the fakes of the unit tests of the streaming source's reads
(test_kafka_source.py) and of replay's schema load (tests/unit/server/consume/test_replay_schemas.py)."""
from __future__ import annotations

import pyarrow as pa
from confluent_kafka import OFFSET_INVALID, TopicPartition

from iox_spark.catalog.schema import Column
from iox_spark.server.write_buffer.wire_format import encode_write
from tests.timestamps import T0

__all__ = ["TOPIC", "Msg", "Control", "RecordingConsumer", "write_message", "partition_log"]

TOPIC = "iox.db"


class Msg:
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


class Control:
    """A transaction control record (commit or abort marker) at `offset`: in the log, fetched like a
    message, but `consume` never returns it; it moves the partition's position past it."""

    def __init__(self, partition: int, offset: int):
        self._p, self._o = partition, offset

    def partition(self):
        return self._p

    def offset(self):
        return self._o


class RecordingConsumer:
    """Holds {partition: [records]} (messages and control records in offset order; an offset with
    neither is a gap, as compaction leaves). `consume` hands out the assigned partitions' messages in
    order, passing control records, and records (num_messages, timeout, how many it returned):
    fewer returned than asked with a timeout > 0 is a call that would have waited out its timeout.

    Arrival: the first `slow` consume calls of an assignment receive nothing (messages slow to
    come); from then on each call first receives one fetch: the next `fetch` records of each
    assigned partition (all of them when None). `stale_position`: the position `assign` leaves
    (an earlier assignment's, not reset yet) instead of OFFSET_INVALID. The cached watermark of a
    partition fetched in this assignment is its true end (Tansu's own, which a fetch answers with);
    `fetch_hw` overrides it; `max_fetches` bounds the fetches an assignment receives (the next
    one has not arrived yet)."""

    def __init__(self, log: dict[int, list], fetch: int | None = None, slow: int = 0,
                 stale_position: int | None = None, fetch_hw: dict | None = None,
                 max_fetches: int | None = None):
        self.log = log
        self.max_fetches = max_fetches
        self._fetches = 0
        self.fetch_hw = fetch_hw or {}
        self._fetched: set = set()  # partitions a fetch answered in this assignment
        self.fetch, self.slow, self.stale_position = fetch, slow, stale_position
        self.pending: dict[int, list] = {}  # partition -> records not fetched yet
        self.queue: list = []  # fetched records, not passed yet
        self.positions: dict[int, int] = {}
        self._slow_left = 0
        self.calls: list[tuple[int, float, int]] = []
        self.closed = False

    def assign(self, tps):
        self.pending = {tp.partition: [r for r in self.log[tp.partition] if r.offset() >= tp.offset] for tp in tps}
        self.queue = []
        start = OFFSET_INVALID if self.stale_position is None else self.stale_position
        self.positions = {tp.partition: start for tp in tps}
        self._slow_left = self.slow
        self._fetched = set()
        self._fetches = 0

    def unassign(self):
        self.pending, self.queue, self.positions = {}, [], {}
        self._fetched = set()

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        assert cached, "only the cached watermark of a fetch is asked"
        if tp.partition not in self._fetched:
            return OFFSET_INVALID, OFFSET_INVALID
        log = self.log[tp.partition]
        return 0, self.fetch_hw.get(tp.partition, log[-1].offset() + 1 if log else 0)

    def close(self):
        self.closed = True

    def consume(self, num_messages=1, timeout=-1):
        if self._slow_left > 0:
            self._slow_left -= 1
        elif self.max_fetches is None or self._fetches < self.max_fetches:
            self._fetches += 1
            for p, records in self.pending.items():
                n = len(records) if self.fetch is None else self.fetch
                self.queue += records[:n]
                self.pending[p] = records[n:]
                self._fetched.add(p)
        out = []
        while self.queue and len(out) < num_messages:
            r = self.queue.pop(0)
            # librdkafka moves a position only forward: a leftover higher one stays
            self.positions[r.partition()] = max(self.positions[r.partition()], r.offset() + 1)
            if isinstance(r, Msg):
                out.append(r)
        self.calls.append((num_messages, timeout, len(out)))
        return out

    def position(self, tps):
        return [TopicPartition(tp.topic, tp.partition, self.positions.get(tp.partition, OFFSET_INVALID))
                for tp in tps]

    def waited_out(self):
        return [c for c in self.calls if c[1] > 0 and c[2] < c[0]]


def write_message(table: str, n: int, field: str = "v", typ: str = "float"):
    """A write-buffer message of `n` rows of `table`: one field column of `typ` (float or integer)."""
    arrow = {"float": pa.float64(), "integer": pa.int64()}[typ]
    data = pa.table({field: pa.array(range(n), arrow), "time": pa.array([T0 + i for i in range(n)], pa.int64())})
    return encode_write(table, [Column(field, "field", typ), Column("time", "time", "time")], data)


def partition_log(partition: int, messages, controls=(), w=None) -> list:
    """A partition's log: a message at each offset of `messages`, a control record at each of
    `controls`; any other offset is a gap."""
    w = w or write_message("cpu", 1)
    out = [Msg(partition, o, w.value, w.headers) for o in messages] + [Control(partition, o) for o in controls]
    return sorted(out, key=lambda r: r.offset())
