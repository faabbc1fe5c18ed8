"""Messages put on a database's topic by a producer other than an iox server, for the tests that
check how the consumer reads them (test_foreign_messages, test_kafka_source_fetch, test_end_polls).
Their headers are those an iox server writes for one write of table `cpu`."""
from __future__ import annotations

import json

import pyarrow as pa
from confluent_kafka import Producer
from tests.timestamps import T0

__all__ = ["PARTITIONS", "produce", "write_headers", "ipc", "applied_rows"]

#: Kafka partitions of the session server's databases (tests/conftest.py)
PARTITIONS = 4


def produce(bootstrap: str, topic: str, kp: int, msgs: list) -> list[int]:
    """Produces `msgs` ((value, headers) pairs) to partition `kp`; returns their offsets."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 3})
    offsets = []

    def on(err, m):
        assert err is None, err
        offsets.append(m.offset())

    for value, headers in msgs:
        p.produce(topic, value=value, key=b"foreign", headers=headers, partition=kp, on_delivery=on)
    assert p.flush(30) == 0
    return sorted(offsets)


def write_headers(rows: int) -> list:
    """The headers of a write of `rows` rows of table `cpu` (host tag, v field) on 2023-11-14."""
    schema = json.dumps([["host", "tag", "string"], ["v", "field", "float"], ["time", "time", "time"]])
    return [("iox-format", b"2"), ("iox-kind", b"write"), ("iox-table", b"cpu"), ("iox-schema", schema.encode()),
            ("iox-rows", str(rows).encode()), ("iox-days", json.dumps({"2023-11-14": [rows, T0, T0]}).encode())]


def ipc(t: pa.Table) -> bytes:
    """`t` as one Arrow IPC stream: a write's payload."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def applied_rows(client, db) -> int:
    """Rows in the catalog's chunks (a query would also read the write-buffer tail)."""
    st = client.status(db)["databases"][0]
    return sum(int(c["rows"]) for t in st["tables"] for p in t["partitions"] for c in p["chunks"])
