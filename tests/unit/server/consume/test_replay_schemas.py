"""load_replay_schemas (server/consume/replay_schemas.py) against the recording consumer
of tests/unit/server/write_buffer/fake_consumer.py (librdkafka's `consume` and `position` contracts):
it merges the column types of every write in the replay ranges and never waits for more messages
than will come, so it never waits out a `consume` timeout, also when offsets hold no message (transaction control records,
compaction). The real consumer is exercised by the restart integration tests."""
from __future__ import annotations

import pytest

from iox_spark.catalog.catalog import Database
from iox_spark.server.consume import replay_schemas
from tests.unit.server.write_buffer.fake_consumer import TOPIC, Msg, RecordingConsumer, partition_log, write_message


def test_replay_schemas_reads_exactly_the_ranges_without_waiting_out_a_timeout(monkeypatch):
    a, b = write_message("cpu", 1), write_message("mem", 2, field="used", typ="integer")
    log = {0: [Msg(0, off, a.value, a.headers) for off in range(5)],
           1: [Msg(1, off, b.value, b.headers) for off in range(3)]}
    c = RecordingConsumer(log)
    monkeypatch.setattr(replay_schemas, "reader_consumer", lambda bootstrap, **conf: c)
    db = Database(name="db", topic=TOPIC, kafka_partitions=2)
    # partition 0 from offset 2 to 4, partition 1 from 0 to 1 (its offset 2 is beyond the range)
    read = replay_schemas.load_replay_schemas("fake:9092", db, {0: 2}, {0: 4, 1: 1})
    assert read == 5
    assert db.schemas.get("cpu").get("v").type == "float"
    assert db.schemas.get("mem").get("used").type == "integer"
    assert c.waited_out() == []
    assert [n for n, _t, _got in c.calls] == [5]


@pytest.mark.parametrize("fetch", [None, 1])
def test_replay_schemas_reads_ranges_with_gaps_and_trailing_control_records(monkeypatch, fetch):
    # partition 0: a marker in the middle and one at the end of its range (the last offset Kafka
    # held at start); partition 1: a range of a marker only (the previous run applied everything
    # before it); partition 2: compacted, its range starting at a gap, the partition going on after it
    a, b, d = write_message("cpu", 1), write_message("mem", 2, field="used", typ="integer"), write_message("disk", 1, field="free")
    c = RecordingConsumer({0: partition_log(0, [0, 1, 3], [2, 4], a), 1: partition_log(1, [0], [1], b),
                   2: partition_log(2, [0, 5, 9, 14], [], d)}, fetch=fetch)
    monkeypatch.setattr(replay_schemas, "reader_consumer", lambda bootstrap, **conf: c)
    monkeypatch.setattr(replay_schemas, "READ_STALL_TIMEOUT_S", 1.0)  # a stall fails within a second
    db = Database(name="db", topic=TOPIC, kafka_partitions=3)
    read = replay_schemas.load_replay_schemas("fake:9092", db, {0: 0, 1: 1, 2: 1}, {0: 4, 1: 1, 2: 12})
    assert read == 3 + 0 + 2  # messages 0, 1, 3 of partition 0; 5, 9 of partition 2; each once
    assert db.schemas.get("cpu").get("v").type == "float"
    assert db.schemas.get("mem") is None  # its only message is before the range
    assert db.schemas.get("disk").get("free").type == "float"
    assert c.waited_out() == []
