"""The write API on real parts: schema rules, limits and errors, WriteArrow, and the
InfluxDB v2 compatible HTTP endpoint (including the `influxdb-client` package).

Nothing-written checks use write tokens (Kafka offsets are consecutive per partition,
one message per table per request) or the absence of the database's Kafka topic.
"""
from __future__ import annotations

import datetime as dt
import gzip
import http.client
import json
import os
import socket
import time
import uuid
from decimal import Decimal

import grpc
import pyarrow as pa
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from iox_spark.iox import write_pb2
from iox_spark.catalog.sharding import partition_for, topic_for
from tests.timestamps import T0
from tests.rows import query_rows

I64_MIN, I64_MAX, U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
UTC = dt.timezone.utc


# -- helpers ---------------------------------------------------------------------------

def _rpc_error(fn, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn(*args, **kw)
    return ei.value


def _schema(client, db, table) -> dict:
    st = client.status(db)["databases"][0]
    for t in st["tables"]:
        if t["name"] == table:
            return {c["name"]: (c["role"], c["type"]) for c in t["columns"]}
    raise AssertionError(f"no table {table!r} in {db}")


def _tables(client, db) -> set:
    return {t["name"] for t in client.status(db)["databases"][0]["tables"]}


def _topic_absent(iox_server, db) -> bool:
    return topic_for(db) not in iox_server.write_buffer.list_database_topics()


def _http(port, method, path, body=b"", headers=None):
    """(status, headers {lower-case name: value}, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _http_write(port, org, bucket, body, precision="ns", headers=None):
    if isinstance(body, str):
        body = body.encode()
    return _http(port, "POST", f"/api/v2/write?org={org}&bucket={bucket}&precision={precision}", body, headers)


def _org_bucket():
    return f"o{uuid.uuid4().hex[:10]}", "b"


def _lp_token(partitions: int, requests: list) -> dict:
    """The write token of accepted requests given as lists of table names (one message per table)."""
    counts: dict = {}
    for tables in requests:
        for t in set(tables):
            p = partition_for(t, partitions)
            counts[p] = counts.get(p, 0) + 1
    return {p: n - 1 for p, n in counts.items()}


def _two_tables_on_different_partitions(partitions: int, prefix: str) -> tuple:
    a = f"{prefix}_a"
    i = 0
    while True:
        b = f"{prefix}_b{i}"
        if partition_for(b, partitions) != partition_for(a, partitions):
            return a, b
        i += 1


# -- schema ----------------------------------------------------------------------------

def test_type_conflict_across_requests_is_rejected_whole(client, db, iox_server):
    parts = iox_server.config.partitions
    m, other = _two_tables_on_different_partitions(parts, "m")
    t1 = client.write(db, f"{m},t=a v=1i,s=\"x\" {T0}\n")
    # a request touching two tables; only the second line conflicts (float for an integer field)
    err = _rpc_error(client.write, db, f"{other} f=1 {T0}\n{m},t=a v=1.5 {T0 + 1}\n")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    d = err.details()
    assert f"'{m}'" in d and "'v'" in d and "integer" in d and "float" in d, d
    # a tag where a field was, and a field where a tag was
    for lp, col in ((f"{m},v=x w=1 {T0 + 2}\n", "'v'"), (f"{m} t=1 {T0 + 3}\n", "'t'")):
        err = _rpc_error(client.write, db, lp)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and col in err.details() and "tag" in err.details()
    # the reserved names (time_ns, _iox_seq, and _iox_day: the Iceberg tables' day), as a tag or a field
    for lp, col in ((f"{m},_iox_day=x v=1i {T0 + 2}\n", "'_iox_day'"), (f"{m} _iox_day=1i {T0 + 2}\n", "'_iox_day'"),
                    (f"{m} _iox_seq=1i {T0 + 2}\n", "'_iox_seq'"), (f"{m},time_ns=x v=1i {T0 + 2}\n", "'time_ns'")):
        err = _rpc_error(client.write, db, lp)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and col in err.details() and "reserved" in err.details()
    # nothing of them reached Kafka or the schema: the next write lands right after the first
    t2 = client.write(db, f"{m},t=a v=2i {T0 + 4}\n")
    assert t2 == {p: off + 1 for p, off in t1.items()}
    client.wait_applied(db, t2, timeout_s=60)
    assert _tables(client, db) == {m}
    assert _schema(client, db, m) == {"t": ("tag", "string"), "v": ("field", "integer"),
                                      "s": ("field", "string"), "time": ("time", "time")}
    assert query_rows(client, db, f"SELECT t, v, s, time_ns FROM {m} ORDER BY time_ns") == [
        {"t": "a", "v": 1, "s": "x", "time_ns": T0}, {"t": "a", "v": 2, "s": None, "time_ns": T0 + 4}]


def test_a_table_takes_at_most_max_columns_per_table(client, db, iox_server):
    """The default limit (200 columns, time included, as IOx's): a request that would pass it is
    rejected whole, through gRPC and HTTP, and the table keeps taking its own columns."""
    limit = iox_server.config.max_columns_per_table
    assert limit == 200
    fields = ",".join(f"f{i}={i}i" for i in range(limit - 2))  # tag + time + 198 fields = 200
    tok = client.write(db, f"wide,t=a {fields} {T0}\n")
    err = _rpc_error(client.write, db, f"wide,t=a extra=1i {T0 + 1}\nnarrow v=1i {T0}\n")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'wide' has 200 columns, this write would make it 201" in err.details(), err.details()
    status, _h, body = _http(iox_server.config.http_port, "POST", f"/write?db={db}", f"wide,t=a extra=1i {T0 + 1}\n".encode())
    assert status == 400 and b"at most 200 columns per table" in body, (status, body)
    tok = client.write(db, f"wide,t=b f0=7i {T0 + 2}\n")
    client.wait_applied(db, tok, timeout_s=60)
    assert _tables(client, db) == {"wide"}
    assert query_rows(client, db, "SELECT t, f0, f197 FROM wide ORDER BY time_ns") == [
        {"t": "a", "f0": 0, "f197": 197}, {"t": "b", "f0": 7, "f197": None}]


def test_type_conflict_within_a_request_names_the_line(client, db, iox_server):
    err = _rpc_error(client.write, db, f"m v=1i {T0}\nm v=2i {T0 + 1}\nm v=1.5 {T0 + 2}\nm,v=x f=1 {T0 + 3}\n")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    br = error_details_pb2.BadRequest()
    assert rpc_status.from_call(err).details[0].Unpack(br)
    assert [v.field for v in br.field_violations] == ["line 3", "line 4"]
    assert "'v'" in br.field_violations[0].description
    assert _topic_absent(iox_server, db)


def test_two_tables_keep_their_own_types(client, db, iox_server):
    a, b = _two_tables_on_different_partitions(iox_server.config.partitions, "tt")
    tok = client.write(db, f"{a} v=1i {T0}\n{b} v=1.5 {T0}\n")
    assert len(tok) == 2  # one message per table, each on its table's partition
    tok_a = client.write(db, f"{a} v=2i {T0 + 1}\n")
    err = _rpc_error(client.write, db, f"{b} v=2i {T0 + 1}\n")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and f"'{b}'" in err.details()
    tok_b = client.write(db, f"{b} v=2.5 {T0 + 1}\n")
    assert tok_b == {partition_for(b, iox_server.config.partitions): tok[partition_for(b, iox_server.config.partitions)] + 1}
    for t in (tok_a, tok_b):
        client.wait_applied(db, t, timeout_s=60)
    assert _schema(client, db, a)["v"] == ("field", "integer")
    assert _schema(client, db, b)["v"] == ("field", "float")
    assert query_rows(client, db, f"SELECT v, time_ns FROM {a} ORDER BY time_ns") == [
        {"v": 1, "time_ns": T0}, {"v": 2, "time_ns": T0 + 1}]
    assert query_rows(client, db, f"SELECT v, time_ns FROM {b} ORDER BY time_ns") == [
        {"v": 1.5, "time_ns": T0}, {"v": 2.5, "time_ns": T0 + 1}]


def test_new_tags_and_fields_appear_earlier_rows_null(client, db):
    t1 = client.write(db, f"m,host=a v=1 {T0}\n")
    client.wait_applied(db, t1, timeout_s=60)
    t2 = client.write(db, f"m,host=a,dc=x v=2,extra=3i,s=\"z\" {T0 + 1}\n")
    client.wait_applied(db, t2, timeout_s=60)
    assert query_rows(client, db, "SELECT host, dc, v, extra, s, time_ns FROM m ORDER BY time_ns") == [
        {"host": "a", "dc": None, "v": 1.0, "extra": None, "s": None, "time_ns": T0},
        {"host": "a", "dc": "x", "v": 2.0, "extra": 3, "s": "z", "time_ns": T0 + 1},
    ]


# -- limits and names ------------------------------------------------------------------

def test_request_over_the_size_limit_is_resource_exhausted(client, db, iox_server):
    limit = iox_server.config.max_request_bytes
    line = f"big,host=h v=1 {T0}\n".encode()
    body = line * (limit // len(line) + 1)
    assert len(body) > limit
    err = _rpc_error(client.write, db, body)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(limit) in err.details() and str(len(body)) in err.details()
    # WriteArrow: the IPC bytes count
    n = limit // 16 + 1
    big = pa.table({"v": pa.array(range(n), pa.int64()), "t": pa.array(range(n), pa.int64())})
    err = _rpc_error(client.write_arrow, db, {"big": (big, {"v": "field", "t": "time"})})
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and str(limit) in err.details()
    # a message past the limit and its framing is refused by grpc before it is read, naming its limit
    from iox_spark.server.api.grpc_services import REQUEST_FRAMING_BYTES

    err = _rpc_error(client.write, db, line * ((limit + REQUEST_FRAMING_BYTES) // len(line) + 1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(limit + REQUEST_FRAMING_BYTES) in err.details()
    # exactly at the limit is fine
    ok = line * (limit // len(line))
    assert len(ok) <= limit
    client.wait_applied(db, client.write(db, ok), timeout_s=120)
    assert query_rows(client, db, "SELECT count(*) AS n FROM big") == [{"n": 1}]  # one point, merged


def test_invalid_database_names(client, iox_server):
    port = iox_server.config.http_port
    tbl = pa.table({"v": [1.0], "t": pa.array([T0], pa.int64())})
    for name in ("", "has space", "x" * 65, "semi;colon", "dot.ted", "ünï"):
        for fn in (lambda: client.write(name, f"x v=1 {T0}\n"),
                   lambda: client.write_arrow(name, {"x": (tbl, {"v": "field", "t": "time"})})):
            err = _rpc_error(fn)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert "database name" in err.details()
    # HTTP: the database is <org>_<bucket>
    for org, bucket in (("my%20org", "b"), ("o", "b%2Fc"), ("o" * 40, "b" * 40)):
        status, _, body = _http_write(port, org, bucket, f"x v=1 {T0}\n")
        assert status == 400, (org, bucket)
        assert json.loads(body)["code"] == "invalid" and "database name" in json.loads(body)["message"]
    # the longest valid name, every allowed character
    name = ("Az09_-" * 11)[:64]
    client.wait_applied(name, client.write(name, f"x v=1 {T0}\n"), timeout_s=60)


# -- WriteArrow ------------------------------------------------------------------------

def test_write_arrow_round_trip_exact_values(client, db, iox_server):
    part1 = pa.table({
        "host": pa.array(["a", "b"], pa.string()),
        "region": pa.array(["west", "east"]).dictionary_encode(),
        "f": pa.array([1.5, -2.25], pa.float64()),
        "i": pa.array([I64_MIN, I64_MAX], pa.int64()),
        "u": pa.array([0, U64_MAX], pa.uint64()),
        "s": pa.array(["x", "ünï 🚀 \"q\" \\"], pa.string()),
        "b": pa.array([True, False], pa.bool_()),
        "ts": pa.array([T0, T0 + 1], pa.int64()),
    })
    part2 = pa.table({
        "host": pa.array([None, "c"], pa.string()),
        "region": pa.array(["west", None]).dictionary_encode(),
        "f": pa.array([float("inf"), 5e-324], pa.float64()),
        "i": pa.array([None, 0], pa.int64()),
        "u": pa.array([None, 1], pa.uint64()),
        "s": pa.array(["", None], pa.string()),
        "b": pa.array([None, True], pa.bool_()),
        "ts": pa.array([T0 + 999_999_999, -1], pa.int64()),  # -1 ns: 1969-12-31, a partition of its own
    })
    data = pa.concat_tables([part1, part2])  # two record batches in the IPC stream
    roles = {"host": "tag", "region": "tag", "f": "field", "i": "field", "u": "field", "s": "field", "b": "field",
             "ts": "time"}
    # the same table also gets a line protocol write: one schema, one table view
    t_lp = client.write(db, f"readings,host=lp f=7,i=7i,u=7u,s=\"lp\",b=t {T0 + 5}\n")
    tok = client.write_arrow(db, {"readings": (data, roles)})
    # time in any timestamp unit (and time zone) converts exactly to nanoseconds
    tokens = [t_lp, tok]
    for unit, value, ns in (("s", 1_700_000_000, T0), ("ms", 1_700_000_000_001, T0 + 1_000_000),
                            ("us", 1_700_000_000_000_002, T0 + 2_000), ("ns", T0 + 3, T0 + 3)):
        ev = pa.table({"unit": [unit], "note": pa.array([f"{unit} note"], pa.large_string()),
                       "v": pa.array([ns], pa.int64()),
                       "when": pa.array([value], pa.timestamp(unit, tz="Europe/Paris" if unit == "ms" else None))})
        tokens.append(client.write_arrow(db, {"events": (ev, {"unit": "tag", "note": "field", "v": "field",
                                                              "when": "time"})}))
    for t in tokens:
        client.wait_applied(db, t, timeout_s=60)
    assert _schema(client, db, "readings") == {
        "host": ("tag", "string"), "f": ("field", "float"), "i": ("field", "integer"), "u": ("field", "uinteger"),
        "s": ("field", "string"), "b": ("field", "boolean"), "time": ("time", "time"), "region": ("tag", "string")}
    rows = query_rows(client, db, "SELECT host, region, f, i, u, s, b, time, time_ns FROM readings ORDER BY time_ns")
    utc = lambda ns: dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=ns // 1000)  # noqa: E731
    assert rows == [
        {"host": "c", "region": None, "f": 5e-324, "i": 0, "u": Decimal(1), "s": None, "b": True,
         "time": utc(-1), "time_ns": -1},
        {"host": "a", "region": "west", "f": 1.5, "i": I64_MIN, "u": Decimal(0), "s": "x", "b": True,
         "time": utc(T0), "time_ns": T0},
        {"host": "b", "region": "east", "f": -2.25, "i": I64_MAX, "u": Decimal(U64_MAX), "s": "ünï 🚀 \"q\" \\",
         "b": False, "time": utc(T0 + 1), "time_ns": T0 + 1},
        {"host": "lp", "region": None, "f": 7.0, "i": 7, "u": Decimal(7), "s": "lp", "b": True,
         "time": utc(T0 + 5), "time_ns": T0 + 5},
        {"host": None, "region": "west", "f": float("inf"), "i": None, "u": None, "s": "", "b": None,
         "time": utc(T0 + 999_999_999), "time_ns": T0 + 999_999_999},
    ]
    assert query_rows(client, db, "SELECT unit, note, v, time_ns FROM events ORDER BY time_ns") == [
        {"unit": u, "note": f"{u} note", "v": ns, "time_ns": ns}
        for u, ns in (("s", T0), ("ns", T0 + 3), ("us", T0 + 2_000), ("ms", T0 + 1_000_000))]
    # the schema is shared with line protocol: a conflicting type is rejected either way
    err = _rpc_error(client.write, db, f"readings,host=z f=1i {T0}\n")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'f'" in err.details()
    bad = pa.table({"i": pa.array([1.0]), "t": pa.array([T0], pa.int64())})
    err = _rpc_error(client.write_arrow, db, {"readings": (bad, {"i": "field", "t": "time"})})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'readings'" in err.details() and "'i'" in err.details() and "integer" in err.details()


def _arrow_case(cols: dict, roles: dict):
    return pa.table(cols), roles


_T = pa.array([T0], pa.int64())
_ARROW_BAD = [
    # (table, (data, roles), substrings the error must name)
    ("sensor", _arrow_case({"h": pa.array([1], pa.int64()), "v": [1.0], "t": _T}, {"h": "tag", "v": "field", "t": "time"}),
     ["'h'", "int64", "tags must be strings"]),
    ("sensor", _arrow_case({"v": pa.array([1.0], pa.float32()), "t": _T}, {"v": "field", "t": "time"}), ["'v'", "float"]),
    ("sensor", _arrow_case({"v": pa.array([1], pa.int32()), "t": _T}, {"v": "field", "t": "time"}), ["'v'", "int32"]),
    ("sensor", _arrow_case({"v": pa.array([[1]]), "t": _T}, {"v": "field", "t": "time"}), ["'v'", "list"]),
    ("sensor", _arrow_case({"v": pa.array([Decimal("1.5")]), "t": _T}, {"v": "field", "t": "time"}), ["'v'", "decimal"]),
    ("sensor", _arrow_case({"v": pa.array([1], pa.timestamp("s")), "t": _T}, {"v": "field", "t": "time"}), ["'v'"]),
    ("sensor", _arrow_case({"v": [1.0], "t": pa.array([None], pa.int64())}, {"v": "field", "t": "time"}),
     ["'t'", "null"]),
    ("sensor", _arrow_case({"v": [1.0], "t": pa.array([1.0])}, {"v": "field", "t": "time"}), ["'t'", "double"]),
    ("sensor", _arrow_case({"v": [1.0], "t": pa.array([10 ** 12], pa.timestamp("s"))}, {"v": "field", "t": "time"}),
     ["'t'", "does not fit"]),
    ("sensor", _arrow_case({"v": [1.0]}, {"v": "field"}), ["exactly one time column"]),
    ("sensor", _arrow_case({"v": [1.0], "t": _T, "t2": _T}, {"v": "field", "t": "time", "t2": "time"}),
     ["exactly one time column"]),
    ("sensor", _arrow_case({"v": [1.0], "w": [2.0], "t": _T}, {"v": "field", "t": "time"}), ["'w'", "no role"]),
    ("sensor", _arrow_case({"v": [1.0], "t": _T}, {"v": "field", "t": "time", "ghost": "tag"}), ["'ghost'"]),
    ("sensor", _arrow_case({"v": [1.0], "t": _T}, {"v": 0, "t": "time"}), ["'v'", "role"]),
    ("sensor", _arrow_case({"time": ["x"], "v": [1.0], "ts": _T}, {"time": "tag", "v": "field", "ts": "time"}),
     ["'time'"]),
    ("sensor", _arrow_case({"time": [2.0], "ts": _T}, {"time": "field", "ts": "time"}), ["'time'"]),
    ("sensor", _arrow_case({"time_ns": [1.0], "t": _T}, {"time_ns": "field", "t": "time"}), ["'time_ns'", "reserved"]),
    ("sensor", _arrow_case({"_iox_seq": [1.0], "t": _T}, {"_iox_seq": "field", "t": "time"}),
     ["'_iox_seq'", "reserved"]),
    ("sensor", _arrow_case({"_iox_day": ["x"], "v": [1.0], "t": _T}, {"_iox_day": "tag", "v": "field", "t": "time"}),
     ["'_iox_day'", "reserved"]),
    ("sensor", _arrow_case({"v": [float("nan")], "t": _T}, {"v": "field", "t": "time"}), ["'v'", "NaN"]),
    ("sensor", _arrow_case({"h": [""], "v": [1.0], "t": _T}, {"h": "tag", "v": "field", "t": "time"}),
     ["'h'", "empty"]),
    ("sensor", _arrow_case({"v": pa.array([1.0, None]), "w": pa.array([None, None], pa.int64()),
                            "t": pa.array([T0, T0 + 1], pa.int64())}, {"v": "field", "w": "field", "t": "time"}),
     ["row 1", "no field values"]),
    ("sensor", _arrow_case({"h": ["a"], "t": _T}, {"h": "tag", "t": "time"}), ["at least one field"]),
    ("sensor", _arrow_case({"v": pa.array([], pa.float64()), "t": pa.array([], pa.int64())},
                           {"v": "field", "t": "time"}), ["no points"]),
    ("", _arrow_case({"v": [1.0], "t": _T}, {"v": "field", "t": "time"}), ["table name"]),
]


def test_write_arrow_validation_errors(client, db, iox_server):
    for table, (data, roles), words in _ARROW_BAD:
        err = _rpc_error(client.write_arrow, db, {table: (data, roles)})
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (table, roles, err.details())
        if table and words != ["no points"]:
            assert f"'{table}'" in err.details(), err.details()
        for w in words:
            assert w in err.details(), (w, err.details())
    # one bad table rejects the whole request, good tables included
    good = pa.table({"v": [1.0], "t": _T})
    bad = pa.table({"v": pa.array([1.0], pa.float32()), "t": _T})
    err = _rpc_error(client.write_arrow, db, {"ok": (good, {"v": "field", "t": "time"}),
                                              "sensor": (bad, {"v": "field", "t": "time"})})
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'sensor'" in err.details()
    # a table twice in one request, and bytes that are not an Arrow IPC stream
    req = write_pb2.WriteArrowRequest(database=db)
    for payload in (b"not arrow", b"not arrow"):
        t = req.tables.add(table="sensor", arrow_ipc=payload)
        t.columns.add(name="v", role=write_pb2.ColumnRole.FIELD)
    err = _rpc_error(client.write_stub.WriteArrow, req, timeout=30)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than once" in err.details()
    del req.tables[1]
    err = _rpc_error(client.write_stub.WriteArrow, req, timeout=30)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "Arrow IPC" in err.details()
    # nothing of any of them reached Kafka
    assert _topic_absent(iox_server, db)


# -- HTTP (InfluxDB v2) ----------------------------------------------------------------

def test_http_write_204_then_query(client, iox_server):
    port = iox_server.config.http_port
    org, bucket = _org_bucket()
    db = f"{org}_{bucket}"
    status, headers, body = _http_write(port, org, bucket, "h,host=a v=1.5,n=2i,s=\"x y\",ok=true 1700000000000\n"
                                                           "h,host=b v=-1 1700000000001\n", precision="ms")
    assert (status, body) == (204, b"")
    status, _, _ = _http_write(port, org, bucket, f"h,host=c u=18446744073709551615u {T0 + 5}\n")
    assert status == 204
    client.wait_applied(db, _lp_token(iox_server.config.partitions, [["h"], ["h"]]), timeout_s=60)
    assert query_rows(client, db, "SELECT host, v, n, s, ok, u, time_ns FROM h ORDER BY time_ns") == [
        {"host": "a", "v": 1.5, "n": 2, "s": "x y", "ok": True, "u": None, "time_ns": T0},
        {"host": "c", "v": None, "n": None, "s": None, "ok": None, "u": Decimal(U64_MAX), "time_ns": T0 + 5},
        {"host": "b", "v": -1.0, "n": None, "s": None, "ok": None, "u": None, "time_ns": T0 + 1_000_000},
    ]


def test_http_bad_lines_400_json_and_nothing_written(client, iox_server):
    port = iox_server.config.http_port
    org, bucket = _org_bucket()
    body = f"m v=1 {T0}\nm v=oops {T0}\n# comment\n\nm v=2 {T0}\nm,t= v=3 {T0}\nm v=4i {T0}\n"
    status, headers, raw = _http_write(port, org, bucket, body)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    js = json.loads(raw)
    assert js["code"] == "invalid"
    assert [e["line"] for e in js["errors"]] == [2, 4, 5]  # blank and comment lines are not counted
    assert "line 2:" in js["message"] and "line 4:" in js["message"] and "line 5:" in js["message"]
    assert js["line"] == 2
    # a type conflict across requests is a 400 naming table and column too
    assert _http_write(port, org, bucket, f"m v=1 {T0}\n")[0] == 204
    status, _, raw = _http_write(port, org, bucket, f"m v=1i {T0}\n")
    assert status == 400 and "'m'" in json.loads(raw)["message"] and "'v'" in json.loads(raw)["message"]
    # bad precision, missing bucket, empty body
    assert _http_write(port, org, bucket, f"m v=1 {T0}\n", precision="h")[0] == 400
    st, _, raw = _http(port, "POST", f"/api/v2/write?org={org}", f"m v=1 {T0}\n".encode())
    assert st == 400 and "bucket" in json.loads(raw)["message"]
    st, _, raw = _http_write(port, org, bucket, b"")
    assert st == 400 and "no points" in json.loads(raw)["message"]
    # only the one good write reached Kafka
    assert client.write(f"{org}_{bucket}", f"m v=9 {T0 + 1}\n") == {partition_for("m", iox_server.config.partitions): 1}


def test_http_gzip(client, iox_server):
    port = iox_server.config.http_port
    org, bucket = _org_bucket()
    gz = {"Content-Encoding": "gzip"}
    assert _http_write(port, org, bucket, gzip.compress(f"g,k=a v=1 {T0}\n".encode()), headers=gz)[0] == 204
    # two gzip members in one body (what `cat a.gz b.gz` gives) are one body
    two = gzip.compress(f"g,k=b v=2 {T0}\n".encode()) + gzip.compress(f"g,k=c v=3 {T0}\n".encode())
    assert _http_write(port, org, bucket, two, headers=gz)[0] == 204
    for broken in (b"not gzip at all", gzip.compress(f"g,k=d v=4 {T0}\n".encode())[:-6]):
        st, _, raw = _http_write(port, org, bucket, broken, headers=gz)
        assert st == 400 and "gzip" in json.loads(raw)["message"]
    st, _, raw = _http_write(port, org, bucket, f"g v=1 {T0}".encode(), headers={"Content-Encoding": "br"})
    assert st == 400 and "Content-Encoding" in json.loads(raw)["message"]
    client.wait_applied(f"{org}_{bucket}", _lp_token(iox_server.config.partitions, [["g"], ["g"]]), timeout_s=60)
    assert query_rows(client, f"{org}_{bucket}", "SELECT k, v FROM g ORDER BY k") == [
        {"k": "a", "v": 1.0}, {"k": "b", "v": 2.0}, {"k": "c", "v": 3.0}]


def test_http_413_over_the_limit_also_after_decompression(iox_server):
    port = iox_server.config.http_port
    limit = iox_server.config.max_request_bytes
    org, bucket = _org_bucket()
    line = f"big v=1 {T0}\n".encode()
    body = line * (limit // len(line) + 1)
    st, _, raw = _http_write(port, org, bucket, body)
    assert st == 413 and str(limit) in json.loads(raw)["message"]
    # a gzip bomb: 100 KiB on the wire, far over the limit once decompressed
    bomb = gzip.compress(line * (limit // len(line) * 4), compresslevel=9)
    assert len(bomb) < limit // 10
    st, _, raw = _http_write(port, org, bucket, bomb, headers={"Content-Encoding": "gzip"})
    js = json.loads(raw)
    assert st == 413 and js["code"] == "request too large" and str(limit) in js["message"]
    # a declared Content-Length over the limit is answered before the body is sent (Expect: 100-continue)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall((f"POST /api/v2/write?org={org}&bucket={bucket} HTTP/1.1\r\nHost: x\r\n"
                   f"Content-Length: {100 * limit}\r\nExpect: 100-continue\r\n\r\n").encode())
        head = s.recv(65536).decode()
    assert head.startswith("HTTP/1.1 413"), head
    assert _topic_absent(iox_server, f"{org}_{bucket}")


def test_http_health_ping_and_unknown_paths(iox_server):
    port = iox_server.config.http_port
    st, headers, raw = _http(port, "GET", "/health")
    assert st == 200 and json.loads(raw)["status"] == "pass"
    st, headers, raw = _http(port, "GET", "/ping")
    assert (st, raw) == (204, b"") and "x-influxdb-version" in headers
    assert _http(port, "HEAD", "/ping")[0] == 204
    assert _http(port, "GET", "/nope")[0] == 404
    assert _http(port, "GET", "/api/v2/write")[0] == 405


def test_influxdb_client_sync_and_batching(client, iox_server):
    from influxdb_client import InfluxDBClient, Point, WriteOptions, WritePrecision
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException

    port = iox_server.config.http_port
    parts = iox_server.config.partitions
    org, bucket = _org_bucket()
    db = f"{org}_{bucket}"
    with InfluxDBClient(url=f"http://127.0.0.1:{port}", token="any-token", org=org, enable_gzip=True) as ic:
        assert ic.ping()
        w = ic.write_api(write_options=SYNCHRONOUS)
        w.write(bucket=bucket, record=Point("cpu").tag("host", "a").field("usage", 0.1).field("n", 7)
                .field("ok", True).field("msg", 'say "hi", ok').time(T0 + 1, WritePrecision.NS),
                write_precision=WritePrecision.NS)
        w.write(bucket=bucket, record="cpu,host=b usage=2.5,n=-3i 1700000000002", write_precision=WritePrecision.MS)
        w.write(bucket=bucket, record=[{"measurement": "cpu", "tags": {"host": "c"}, "fields": {"usage": 1e-9},
                                        "time": T0 + 3}], write_precision=WritePrecision.NS)
        with pytest.raises(ApiException) as ei:
            w.write(bucket=bucket, record=f"cpu usage=1 {T0}\ncpu usage= {T0}", write_precision=WritePrecision.NS)
        assert ei.value.status == 400 and "line 2" in ei.value.body

        done, errors = [], []
        bw = ic.write_api(write_options=WriteOptions(batch_size=40, flush_interval=10_000, jitter_interval=0,
                                                     max_retries=0),
                          success_callback=lambda conf, data: done.append(data),
                          error_callback=lambda conf, data, exc: errors.append(exc))
        for i in range(100):
            bw.write(bucket=bucket, record=Point("batch").tag("k", str(i % 3)).field("i", i).field("x", i / 8)
                     .time(T0 + i, WritePrecision.NS))
        bw.close()  # flushes every batch
        assert errors == [] and len(done) >= 3
    client.wait_applied(db, _lp_token(parts, [["cpu"]] * 3 + [["batch"]] * len(done)), timeout_s=60)
    assert query_rows(client, db, "SELECT host, usage, n, ok, msg, time_ns FROM cpu ORDER BY time_ns") == [
        {"host": "a", "usage": 0.1, "n": 7, "ok": True, "msg": 'say "hi", ok', "time_ns": T0 + 1},
        {"host": "c", "usage": 1e-9, "n": None, "ok": None, "msg": None, "time_ns": T0 + 3},
        {"host": "b", "usage": 2.5, "n": -3, "ok": None, "msg": None, "time_ns": T0 + 2_000_000},
    ]
    assert query_rows(client, db, "SELECT k, i, x, time_ns FROM batch ORDER BY time_ns") == [
        {"k": str(i % 3), "i": i, "x": i / 8, "time_ns": T0 + i} for i in range(100)]


# -- HTTP (InfluxDB 1.x) -----------------------------------------------------------------

def test_influxdb_1x_client_writes_then_the_query_path_reads_them(client, iox_server):
    """The `influxdb` package (InfluxDB 1.x's Python client): write_points (its JSON points made into
    line protocol with each precision), write(protocol='line'), a retention policy, gzip; its default
    credentials (root/root as Basic authorization) are ignored."""
    from influxdb import InfluxDBClient
    from influxdb.exceptions import InfluxDBClientError

    from iox_spark.server.api.http_api import SERVER_VERSION

    port = iox_server.config.http_port
    parts = iox_server.config.partitions
    db = f"v1{uuid.uuid4().hex[:10]}"
    hour = T0 // 3_600_000_000_000  # 2023-11-14T22:00:00Z in hours
    h_ns, min_ns = 3_600_000_000_000, 60_000_000_000

    def cpu(host, time, **fields):
        return {"measurement": "cpu", "tags": {"host": host}, "time": time, "fields": fields}

    with InfluxDBClient("127.0.0.1", port, database=db) as ic:
        assert ic.ping() == SERVER_VERSION
        assert ic.write_points([cpu("s", dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), usage=0.5, n=3, ok=True,
                                    msg='say "hi", ok')], time_precision="s")
        assert ic.write_points([cpu("m", hour * 60 + 1, usage=1.0)], time_precision="m")
        assert ic.write_points([cpu("h", hour, usage=2.0)], time_precision="h")
        assert ic.write([f"cpu,host=n usage=3,free=10u {T0 + 7}"], params={"db": db}, protocol="line")
        assert ic.write([f"cpu,host=u usage=4 {T0 // 1000 + 8}"], params={"db": db, "precision": "u", "u": "x",
                                                                          "p": "y"}, protocol="line")
        assert ic.write_points([{"measurement": "mem", "fields": {"free": 1}, "time": T0}], retention_policy="weekly")
        # 1.x's default policy is the database itself
        assert ic.write_points([cpu("g", T0 + 10, usage=6.0)], retention_policy="autogen")
        # errors: 1.x's {"error": ...} with the v2 endpoint's statuses; nothing of a bad request is written
        with pytest.raises(InfluxDBClientError) as ei:
            ic.write([f"cpu,host=x usage=1 {T0}", f"cpu usage= {T0}"], params={"db": db}, protocol="line")
        assert ei.value.code == 400 and "line 2" in json.loads(ei.value.content)["error"]
        with pytest.raises(InfluxDBClientError) as ei:
            ic.write_points([cpu("x", T0, usage="text")])
        assert ei.value.code == 400 and "'usage'" in json.loads(ei.value.content)["error"]
        with pytest.raises(InfluxDBClientError) as ei:
            ic.write_points([cpu("x", T0, usage=1.0)], database="no.dots")
        assert ei.value.code == 400 and "invalid database name 'no.dots'" in json.loads(ei.value.content)["error"]
        with pytest.raises(InfluxDBClientError) as ei:
            ic.write_points([cpu("x", T0, usage=1.0)], retention_policy="a" * 64)
        assert ei.value.code == 400 and "longer than 64" in json.loads(ei.value.content)["error"]
    with InfluxDBClient("127.0.0.1", port, database=db, gzip=True) as gz:
        assert gz.write_points([cpu("z", T0 + 9, usage=5.0)])
    client.wait_applied(db, _lp_token(parts, [["cpu"]] * 7), timeout_s=60)
    assert query_rows(client, db, "SELECT host, usage, n, ok, msg, free, time_ns FROM cpu ORDER BY time_ns") == [
        {"host": "h", "usage": 2.0, "n": None, "ok": None, "msg": None, "free": None, "time_ns": hour * h_ns},
        {"host": "m", "usage": 1.0, "n": None, "ok": None, "msg": None, "free": None,
         "time_ns": hour * h_ns + min_ns},
        {"host": "s", "usage": 0.5, "n": 3, "ok": True, "msg": 'say "hi", ok', "free": None, "time_ns": T0},
        {"host": "n", "usage": 3.0, "n": None, "ok": None, "msg": None, "free": Decimal(10), "time_ns": T0 + 7},
        {"host": "z", "usage": 5.0, "n": None, "ok": None, "msg": None, "free": None, "time_ns": T0 + 9},
        {"host": "g", "usage": 6.0, "n": None, "ok": None, "msg": None, "free": None, "time_ns": T0 + 10},
        {"host": "u", "usage": 4.0, "n": None, "ok": None, "msg": None, "free": None, "time_ns": T0 + 8_000},
    ]
    client.wait_applied(f"{db}_weekly", _lp_token(parts, [["mem"]]), timeout_s=60)
    assert query_rows(client, f"{db}_weekly", "SELECT free, time_ns FROM mem") == [{"free": 1, "time_ns": T0}]
    assert _tables(client, db) == {"cpu"}


def test_http_1x_write_ping_and_limits(client, iox_server):
    """What Telegraf's outputs.influxdb sends, over raw HTTP: /write?db=&rp=&precision= with credentials
    in the query and Basic authorization, gzip, 413 over the limit, and /ping as 1.x answers it."""
    port = iox_server.config.http_port
    parts = iox_server.config.partitions
    db = f"tg{uuid.uuid4().hex[:10]}"
    basic = {"Authorization": "Basic dGVsZWdyYWY6c2VjcmV0", "Content-Encoding": "gzip",
             "User-Agent": "Telegraf/1.30.0 Go/1.22.0"}
    body = gzip.compress(f"disk,host=a free=10u,used=3i 1700000000\ndisk,host=b free=20u,used=4i 1700000001\n".encode())
    st, headers, raw = _http(port, "POST", f"/write?db={db}&rp=week&precision=s&u=telegraf&p=secret", body, basic)
    assert (st, raw) == (204, b"") and "x-influxdb-version" in headers
    st, headers, raw = _http(port, "POST", f"/write?db={db}&rp=week&precision=d", b"disk free=1u 1")
    assert st == 400 and headers["content-type"].startswith("application/json")
    assert "precision" in json.loads(raw)["error"]
    st, _, raw = _http(port, "POST", "/write?precision=s", b"disk free=1u 1")
    assert st == 400 and "db" in json.loads(raw)["error"]
    limit = iox_server.config.max_request_bytes
    line = f"big v=1 {T0}\n".encode()
    st, _, raw = _http(port, "POST", f"/write?db={db}", line * (limit // len(line) + 1))
    assert st == 413 and str(limit) in json.loads(raw)["error"]
    client.wait_applied(f"{db}_week", _lp_token(parts, [["disk"]]), timeout_s=60)
    assert query_rows(client, f"{db}_week", "SELECT host, free, used, time_ns FROM disk ORDER BY host") == [
        {"host": "a", "free": Decimal(10), "used": 3, "time_ns": T0},
        {"host": "b", "free": Decimal(20), "used": 4, "time_ns": T0 + 1_000_000_000}]
    assert _topic_absent(iox_server, db)  # only <db>_<rp> was written
    for method in ("GET", "HEAD"):
        st, headers, raw = _http(port, method, "/ping")
        assert (st, raw) == (204, b"") and "content-type" not in headers
        assert headers["x-influxdb-version"] and headers["x-influxdb-build"] == "OSS"
    st, headers, raw = _http(port, "GET", "/ping?verbose=true")
    assert st == 200 and json.loads(raw) == {"version": headers["x-influxdb-version"]}


def test_http_503_with_retry_after_while_broker_down(session_tmp):
    """A server of its own on a broker of its own (same Spark application), as in test_broker_outage."""
    from iox_spark.server.app import IoxServer
    from iox_spark.server.runtime.broker import free_port, start_broker
    from iox_spark.server.api.client import IoxClient
    from tests.conftest import make_config

    port = free_port()
    b = start_broker(port)
    srv = IoxServer(make_config(os.path.join(session_tmp, f"http503-{uuid.uuid4().hex[:6]}"), b.bootstrap,
                                produce_timeout_ms=3000))
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    http_port = srv.config.http_port
    org, bucket = _org_bucket()
    try:
        c.wait_ready(60)
        assert _http_write(http_port, org, bucket, f"m v=1 {T0}\n")[0] == 204
        b.stop()
        t = time.monotonic()
        st, headers, raw = _http_write(http_port, org, bucket, f"m v=2 {T0 + 1}\n")
        assert st == 503, (st, raw)
        assert int(headers["retry-after"]) >= 1
        assert json.loads(raw)["code"] == "unavailable"
        assert time.monotonic() - t < 25
        assert _http(http_port, "GET", "/ping")[0] == 204  # the HTTP server itself stays up
        b = start_broker(port)  # same address; the in-memory broker starts empty
        deadline = time.monotonic() + 10
        while True:  # writes recover within seconds (another database: this one's topic is gone)
            st, headers, raw = _http_write(http_port, org + "x", bucket, f"m v=4 {T0 + 3}\n")
            if st == 204:
                break
            assert st == 503 and "retry-after" in headers, (st, raw)
            assert time.monotonic() < deadline, "writes did not recover after the broker came back"
            time.sleep(0.5)
        # the first database's topic came back empty: a conflict that names how to go on
        st, headers, raw = _http_write(http_port, org, bucket, f"m v=3 {T0 + 2}\n")
        assert st == 409 and json.loads(raw)["code"] == "conflict", (st, raw)
        assert "restart" in json.loads(raw)["message"]
    finally:
        c.close()
        srv.stop()
        b.stop()
