"""The write-buffer entry format: how one table's write is laid out in one Kafka message.

Invariant: every message the server produces carries `iox-format` = FORMAT_VERSION;
a reader that meets another version fails with `WireFormatMismatch` instead of
guessing. One message holds one table's rows of one request, so a request is
applied atomically per table and in write-buffer order.

Layout:
- key: the table name (UTF-8)
- value: an Arrow IPC stream of the rows; columns as `TableBatch.columns`
  (tags: string, fields: their type, `time`: int64 nanoseconds)
A delete is one message too (kind "delete", value: JSON {table, start_ns,
stop_ns_exclusive, predicate}); a database-wide delete is one message per Kafka
partition, so it is ordered with the writes of every table.

- headers: iox-format, iox-kind ("write" | "delete"), iox-table, iox-schema (JSON list of
  [name, role, type]), iox-rows, iox-days (JSON {"YYYY-MM-DD": [rows, min_ns, max_ns]})
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "FORMAT_VERSION",
    "WireFormatMismatch",
    "EncodedWrite",
    "encode_write",
    "encode_delete",
    "decode_payload",
    "partition_key_of_day",
    "day_partitions",
    "day_numbers",
    "NS_PER_DAY",
]

FORMAT_VERSION = 1
NS_PER_DAY = 86_400 * 1_000_000_000


class WireFormatMismatch(Exception):
    def __init__(self, expected: int, actual: str, topic: str = "", offset: int = -1):
        self.expected = expected
        self.actual = actual
        self.topic = topic
        self.offset = offset
        super().__init__(f"write-buffer message at {topic}@{offset} has format {actual!r}, expected {expected}")


@dataclass(frozen=True)
class EncodedWrite:
    table: str
    key: bytes
    value: bytes
    headers: list
    #: explicit Kafka partition (a database-wide delete goes to every one); None = by table
    partition: int | None = None


def partition_key_of_day(day_number: int) -> str:
    import datetime

    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day_number)).isoformat()


def day_numbers(time_ns: pa.Array) -> pa.Array:
    """Exact floor(time_ns / NS_PER_DAY) of an int64 array (correct for negative times)."""
    trunc = pc.divide(time_ns, pa.scalar(NS_PER_DAY, pa.int64()))  # integer division truncates
    inexact_negative = pc.and_(pc.less(time_ns, 0), pc.not_equal(pc.multiply(trunc, NS_PER_DAY), time_ns))
    return pc.subtract(trunc, pc.cast(inexact_negative, pa.int64()))


def day_partitions(time_ns: pa.Array) -> dict[str, list[int]]:
    """{partition key (UTC day): [rows, min_time_ns, max_time_ns]} of a time column."""
    tbl = pa.table({"d": day_numbers(time_ns), "t": time_ns})
    g = tbl.group_by("d").aggregate([("t", "count"), ("t", "min"), ("t", "max")]).sort_by("d")
    cols = [g.column(c).to_pylist() for c in ("d", "t_count", "t_min", "t_max")]
    return {partition_key_of_day(d): [n, lo, hi] for d, n, lo, hi in zip(*cols)}


def encode_write(table: str, columns: list, data: pa.Table) -> EncodedWrite:
    """Encodes one table's validated rows as a write-buffer message. Runs on the router."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as w:
        w.write_table(data)
    schema = [[c.name, c.role, c.type] for c in columns]
    days = day_partitions(data.column("time").combine_chunks())
    headers = [
        ("iox-format", str(FORMAT_VERSION).encode()),
        ("iox-kind", b"write"),
        ("iox-table", table.encode()),
        ("iox-schema", json.dumps(schema, separators=(",", ":")).encode()),
        ("iox-rows", str(data.num_rows).encode()),
        ("iox-days", json.dumps(days, separators=(",", ":")).encode()),
    ]
    return EncodedWrite(table=table, key=table.encode(), value=sink.getvalue().to_pybytes(), headers=headers)


def encode_delete(table: str | None, start_ns: int, stop_ns_exclusive: int, predicate_json: list,
                  partition: int | None = None) -> EncodedWrite:
    """A delete as a write-buffer message (kind "delete"; JSON value). Runs on the router."""
    body = {"table": table, "start_ns": start_ns, "stop_ns_exclusive": stop_ns_exclusive,
            "predicate": predicate_json}
    headers = [
        ("iox-format", str(FORMAT_VERSION).encode()),
        ("iox-kind", b"delete"),
        ("iox-table", (table or "").encode()),
        ("iox-rows", b"0"),
    ]
    return EncodedWrite(table=table or "", key=(table or "").encode(),
                        value=json.dumps(body, separators=(",", ":")).encode(), headers=headers,
                        partition=partition)


def decode_payload(value: bytes) -> pa.Table:
    """Arrow IPC stream bytes -> table. Runs on Spark executors (pure, picklable)."""
    return pa.ipc.open_stream(pa.py_buffer(value)).read_all()
