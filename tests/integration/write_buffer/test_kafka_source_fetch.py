"""The streaming source reads a write-buffer message larger than its fetch sizes
(server/write_buffer/kafka_source.py `reader_consumer`: at most FETCH_MAX_PARTITION_BYTES per partition and
FETCH_MAX_BYTES per fetch, small so the broker's answer to one fetch never holds up a produce for
long): the broker returns a first record batch whole whatever its size, so a message of a foreign
producer up to the write buffer's `message.max.bytes` is applied, and the messages after it too.
Real broker, real server."""
from __future__ import annotations

import pyarrow as pa
from confluent_kafka import Producer

from iox_spark.server.write_buffer.kafka_source import FETCH_MAX_BYTES, FETCH_MAX_PARTITION_BYTES
from iox_spark.catalog.sharding import partition_for, topic_for
from tests.integration.foreign_messages import PARTITIONS, applied_rows, ipc, write_headers
from tests.timestamps import T0
from tests.waiting import wait_for


def test_a_message_larger_than_the_fetch_sizes_is_applied_and_so_are_the_ones_after_it(client, db, iox_server):
    client.wait_applied(db, client.write(db, f"cpu,host=first v=1 {T0}\n"), timeout_s=60)
    n = 400_000
    big = ipc(pa.table({"host": [f"host-{i:07d}-{'x' * 32}" for i in range(n)], "v": [float(i) for i in range(n)],
                         "time": pa.array([T0] * n, pa.int64())}))
    assert len(big) > 2 * FETCH_MAX_BYTES > 2 * FETCH_MAX_PARTITION_BYTES
    p = Producer({"bootstrap.servers": iox_server.bootstrap, "acks": "all", "log_level": 3,
                  "message.max.bytes": 64 * 1024 * 1024})
    p.produce(topic_for(db), value=big, key=b"foreign", headers=write_headers(n),
              partition=partition_for("cpu", PARTITIONS))
    assert p.flush(60) == 0
    tok = client.write(db, f"cpu,host=last v=2 {T0}\n")
    client.wait_applied(db, tok, timeout_s=120)
    wait_for(lambda: applied_rows(client, db) == n + 2, 60, "the large message applied")
    rows = client.query(db, "SELECT count(*) AS n, sum(v) AS s, count(DISTINCT host) AS h FROM cpu").to_pylist()
    assert rows == [{"n": n + 2, "s": float(sum(range(n))) + 3.0, "h": n + 2}]
