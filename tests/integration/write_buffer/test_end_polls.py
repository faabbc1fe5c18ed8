"""Writes to a partition that went idle are still applied, once (server/write_buffer/end_polls.py).

The streaming source asks the broker for such a partition's end only every
`DEFAULT_MAX_DELAY_S` once it stopped moving, unless the server marked it (a
write of this server was acknowledged there): this server's writes and another
producer's must both still reach a micro-batch, once. Real broker, real server.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from confluent_kafka import Producer

from iox_spark.server.write_buffer.end_polls import DEFAULT_MAX_DELAY_S
from iox_spark.catalog.sharding import partition_for, topic_for
from tests.integration.foreign_messages import PARTITIONS, applied_rows, ipc, write_headers
from tests.timestamps import T0


def test_writes_to_an_idle_partition_are_applied_once(client, db, iox_server):
    n = 50  # one Kafka message (offset) per request
    with ThreadPoolExecutor(8) as ex:
        tokens = list(ex.map(lambda i: client.write(db, f"cpu,host=a v={i} {T0 + i}\n"), range(n)))
    for tok in tokens:
        client.wait_applied(db, tok, timeout_s=120)
    # the idle time is what is tested: the source backs off to its longest delay meanwhile
    time.sleep(3 * DEFAULT_MAX_DELAY_S)
    other = next(t for t in (f"mem{i}" for i in range(100)) if partition_for(t, PARTITIONS) != partition_for("cpu", PARTITIONS))
    tok = client.write(db, f"{other} v=1 {T0}\n")  # marks another partition than cpu's
    client.wait_applied(db, tok, timeout_s=60)
    tok = client.write(db, f"cpu,host=b v=1 {T0}\n")  # this server's write: its partition is marked
    client.wait_applied(db, tok, timeout_s=60)
    time.sleep(3 * DEFAULT_MAX_DELAY_S)
    # another producer's write: no mark, found by the backed-off asks
    p = Producer({"bootstrap.servers": iox_server.bootstrap, "acks": "all", "log_level": 3})
    value = ipc(pa.table({"host": ["c"], "v": [1.0], "time": pa.array([T0], pa.int64())}))
    delivered = []
    p.produce(topic_for(db), value=value, key=b"foreign", headers=write_headers(1),
              partition=partition_for("cpu", PARTITIONS),
              on_delivery=lambda err, msg: delivered.append((err, msg.partition(), msg.offset())))
    assert p.flush(30) == 0
    ((err, kp, off),) = delivered
    assert err is None
    # applied (the applied watermark moves once the batch's table views are made): a query reads it
    client.wait_applied(db, {kp: off}, timeout_s=60)
    assert applied_rows(client, db) == n + 3
    rows = client.query(db, "SELECT host, count(*) AS n, sum(v) AS s FROM cpu GROUP BY host ORDER BY host").to_pylist()
    assert rows == [{"host": "a", "n": n, "s": float(sum(range(n)))},
                    {"host": "b", "n": 1, "s": 1.0}, {"host": "c", "n": 1, "s": 1.0}]
