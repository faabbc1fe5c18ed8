"""load_replay_schemas (server/replay_schemas.py) against the recording consumer of
test_kafka_source.py (librdkafka's `consume` contract): it merges the column types of every write
in the replay ranges and never asks for more messages than the ranges still hold, so it never waits
out a `consume` timeout. The real consumer is exercised by the restart integration tests."""
from __future__ import annotations

from catalog.catalog import Database
from server import replay_schemas
from tests.unit.server.test_kafka_source import TOPIC, _Consumer, _Msg, _write


def test_replay_schemas_reads_exactly_the_ranges_without_waiting_out_a_timeout(monkeypatch):
    a, b = _write("cpu", 1), _write("mem", 2, field="used", typ="integer")
    log = {0: [_Msg(0, off, a.value, a.headers) for off in range(5)],
           1: [_Msg(1, off, b.value, b.headers) for off in range(3)]}
    c = _Consumer(log)
    monkeypatch.setattr(replay_schemas, "reader_consumer", lambda bootstrap: c)
    db = Database(name="db", topic=TOPIC, kafka_partitions=2)
    # partition 0 from offset 2 to 4, partition 1 from 0 to 1 (its offset 2 is beyond the range)
    read = replay_schemas.load_replay_schemas("fake:9092", db, {0: 2}, {0: 4, 1: 1})
    assert read == 5
    assert db.schemas.get("cpu").get("v").type == "float"
    assert db.schemas.get("mem").get("used").type == "integer"
    assert c.waited_out() == []
    assert [n for n, _t, _got in c.calls] == [5]
