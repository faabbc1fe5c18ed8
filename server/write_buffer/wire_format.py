"""The write-buffer entry format: how one table's write is laid out in one Kafka message.

Invariant: every message the server produces carries `iox-format` = FORMAT_VERSION;
a reader that meets a version it does not know fails with `WireFormatMismatch`
instead of guessing (version 1 had no transactions; its messages read as they
always did). One message holds one table's rows of one request; a request of
more than one message is a transaction (catalog/transactions.py) whose
messages are parts, a decision and markers, so it is applied whole or not at all.

Layout:
- key: the table name (UTF-8)
- value: an Arrow IPC stream of the rows; columns as `TableBatch.columns`
  (tags: string, fields: their type, `time`: int64 nanoseconds)
A delete is one message too (kind "delete", value: JSON {table, start_ns,
stop_ns_exclusive, predicate}); a database-wide delete is one message per Kafka
partition, so it is ordered with the writes of every table.

- headers: iox-format, iox-kind ("write" | "delete" | "part" | "decision" | "marker"),
  iox-table, iox-schema (JSON list of [name, role, type]), iox-rows, iox-days
  (JSON {"YYYY-MM-DD": [rows, min_ns, max_ns]}); transaction messages also carry
  iox-txn (the transaction id) and iox-txn-info (JSON): a part {"q": coordinator
  Kafka partition, "of": "write" | "delete"} (its value and other headers are
  those of the write or delete it holds), a decision {"decision": "commit" |
  "abort", "parts": [[kafka partition, offset], ...]}, a marker {"decision": ...}.
  Optional on a write: iox-unique "1" when the writer knows that no two of its
  rows share a tag set and a time (readers that do not know it ignore it; absent
  means unknown), so the consumer may treat the message as deduplicated.

A message without `iox-format` was not written by an iox server (another
producer on the topic): readers skip it, and so they do a message whose headers
the server could never have written (`header_problem`) or whose payload does
not decode (server/consume/ingest.py), logging and counting it, as IOx skips
write-buffer entries it cannot decode. Only a format version
they do not know stops them: that message may hold writes a newer server
acknowledged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from iox_spark.catalog.partition_keys import day_partitions
from iox_spark.catalog.transactions import ABORT, COMMIT, DECISION, PART, TXN_KINDS
from iox_spark.server.errors import ServerError

__all__ = ["FORMAT_VERSION", "WireFormatMismatch", "header_problem", "header_text", "EncodedWrite", "encode_write",
           "encode_delete", "as_part", "encode_decision", "encode_marker", "SUPPORTED_FORMATS", "decode_payload",
           "payload_problem", "decoded_problem", "holds_write"]

FORMAT_VERSION = 2
#: versions a reader accepts: 1 (before transactions) and the current one
SUPPORTED_FORMATS = frozenset({"1", str(FORMAT_VERSION)})


class WireFormatMismatch(ServerError):
    def __init__(self, expected: int, actual: str, topic: str = "", offset: int = -1):
        self.expected = expected
        self.actual = actual
        self.topic = topic
        self.offset = offset
        super().__init__(f"write-buffer message at {topic}@{offset} has format {actual!r}, expected {expected}")


_ROLES_TYPES = {"tag": {"string"}, "field": {"string", "float", "integer", "uinteger", "boolean"},
                "time": {"time"}}


def header_problem(fmt: str, kind: str, table: str, schema: str, days: str, txn: str, txn_info: str) -> str | None:
    """Why a message of a supported (or missing) format cannot be applied, judged from its
    headers (decoded to str; "" when absent); None when it can.

    Called by the consumer (driver) for every message of a micro-batch, before anything
    is planned; a message with a reason is skipped. A format that is present but not in
    SUPPORTED_FORMATS is not judged here: the caller raises `WireFormatMismatch`.
    """
    if not fmt:
        return "no iox-format header (not written by an iox server)"
    if kind == "delete":
        return None  # its JSON value is checked where it is read
    if kind in TXN_KINDS:
        info = _json(txn_info)
        if not txn or not isinstance(info, dict):
            return f"{kind} without iox-txn or a JSON object in iox-txn-info"
        if kind == PART:
            if info.get("of") not in ("write", "delete") or not isinstance(info.get("q"), int):
                return f"part with iox-txn-info {txn_info!r} (expected q and of)"
            if info["of"] == "delete":
                return None
        elif info.get("decision") not in (COMMIT, ABORT) or (
                kind == DECISION and not _pairs(info.get("parts"))):
            return f"{kind} with iox-txn-info {txn_info!r}"
        else:
            return None
    elif kind != "write":
        return f"unknown iox-kind {kind!r}"
    # a write, or a part holding one
    if not table:
        return "write without iox-table"
    cols = _json(schema)
    if not isinstance(cols, list) or not all(
            isinstance(c, list) and len(c) == 3 and all(isinstance(x, str) for x in c) and c[0]
            and c[2] in _ROLES_TYPES.get(c[1], ()) for c in cols):
        return f"write with iox-schema {schema[:200]!r} (expected [[name, role, type], ...])"
    per_day = _json(days)
    if not isinstance(per_day, dict) or not all(
            isinstance(v, list) and len(v) == 3 and all(isinstance(x, int) for x in v) for v in per_day.values()):
        return f"write with iox-days {days[:200]!r} (expected {{day: [rows, min_ns, max_ns]}})"
    return None


#: what a reader takes for an absent (or null) header; "" for the others
_HEADER_DEFAULTS = {"iox-schema": "[]", "iox-days": "{}", "iox-rows": "0"}


def header_text(headers: dict, name: str) -> str:
    """A Kafka header's value as text, its default when absent or null; bytes that are not UTF-8
    (a foreign producer's) read with replacement characters, never an error that would stop a
    reader (`header_problem` then names the message's problem). Pure; runs on executors too."""
    v = headers.get(name)
    return _HEADER_DEFAULTS.get(name, "") if v is None else v.decode("utf-8", "replace")


def _json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        return None


def _pairs(v) -> bool:
    return isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p)
                                       for p in v)


@dataclass(frozen=True)
class EncodedWrite:
    table: str
    key: bytes
    value: bytes
    headers: list
    #: explicit Kafka partition (a database-wide delete goes to every one); None = by table
    partition: int | None = None


def encode_write(table: str, columns: list, data: pa.Table, unique_keys: bool | None = None) -> EncodedWrite:
    """Encodes one table's validated rows as a write-buffer message. Runs on the router.

    `unique_keys`: True when no two rows share a tag set and a time (the iox-unique header)."""
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
    if unique_keys:
        headers.append(("iox-unique", b"1"))
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


def as_part(w: EncodedWrite, txn: str, coordinator_kp: int) -> EncodedWrite:
    """The write or delete `w` as a prepared part of transaction `txn` (same value and partition)."""
    kind = dict(w.headers)["iox-kind"].decode()
    info = json.dumps({"q": coordinator_kp, "of": kind}, separators=(",", ":")).encode()
    headers = [(k, b"part" if k == "iox-kind" else v) for k, v in w.headers]
    headers += [("iox-txn", txn.encode()), ("iox-txn-info", info)]
    return EncodedWrite(table=w.table, key=w.key, value=w.value, headers=headers, partition=w.partition)


def _control(kind: str, txn: str, info: dict, kp: int) -> EncodedWrite:
    headers = [
        ("iox-format", str(FORMAT_VERSION).encode()),
        ("iox-kind", kind.encode()),
        ("iox-table", b""),
        ("iox-rows", b"0"),
        ("iox-txn", txn.encode()),
        ("iox-txn-info", json.dumps(info, separators=(",", ":")).encode()),
    ]
    return EncodedWrite(table="", key=txn.encode(), value=b"", headers=headers, partition=kp)


def encode_decision(txn: str, decision: str, parts: list, kp: int) -> EncodedWrite:
    """The decision of transaction `txn` on its coordinator partition `kp`; parts: [(kp, offset)]."""
    return _control("decision", txn, {"decision": decision, "parts": [list(p) for p in parts]}, kp)


def encode_marker(txn: str, decision: str, kp: int) -> EncodedWrite:
    """The decision of transaction `txn` repeated on partition `kp`, after its parts there."""
    return _control("marker", txn, {"decision": decision}, kp)


def decode_payload(value: bytes) -> pa.Table:
    """Arrow IPC stream bytes -> table. Runs on Spark executors (pure, picklable)."""
    return pa.ipc.open_stream(pa.py_buffer(value)).read_all()


def holds_write(kind: str, txn_info: str) -> bool:
    """A message whose value is a write's payload: a write, or a transaction part of one. Pure."""
    if kind == "write":
        return True
    if kind != PART:
        return False
    info = _json(txn_info)
    return isinstance(info, dict) and info.get("of") == "write"


def payload_problem(value: bytes) -> str | None:
    """Why a write's payload cannot be applied (None when it can): it must be an Arrow IPC
    stream whose rows all have an int64 `time`. Pure; runs where the source reads Kafka."""
    try:
        t = decode_payload(value)
    except Exception as e:  # untrusted bytes: whatever fails to decode is unreadable
        return f"payload is not an Arrow IPC stream ({type(e).__name__}: {e})"
    return decoded_problem(t)


def decoded_problem(t: pa.Table) -> str | None:
    """Why a decoded payload cannot be applied (None when it can): every row needs an int64 time.
    Pure; the one rule the source, the consumer and the write-buffer tail apply."""
    if "time" not in t.column_names or t.schema.field("time").type != pa.int64():
        return "payload without an int64 time column"
    if t.column("time").null_count:
        return "payload with rows without a time"
    return None
