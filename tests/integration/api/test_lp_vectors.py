"""Every line protocol vector of ../shared/lp/cases.jsonl through gRPC Write and through the
InfluxDB v2 HTTP API, on the real broker, Spark and query path.

* `ok` vectors: written, then read back with a query; tags, fields (with their column
  types from GetStatus) and timestamps must be exactly the expected points (points of one
  request with the same table, tags and time merge, last value wins). A null timestamp
  must be the server's clock at the time of the write.
* rejected vectors (`ok: false`, batches with bad lines, and a request without points):
  INVALID_ARGUMENT with a google.rpc.BadRequest / 400 with a JSON body naming each bad
  line, and nothing written: the database's Kafka topic holds no message (it is not even
  created) and the catalog has no table of it.

Ingest cost grows with the number of (table, day) chunks per micro-batch, so vectors
share tables: each accepted vector gets one more tag, `iox_vector=<id>`, inserted right
after its measurement on every line (the rest of the line is untouched), and vectors
whose column types agree share a database; a vector's rows are told apart by that tag.
Everything of one transport is written first, then waited for once (a write token:
gRPC returns it; for HTTP it is derived from the one-message-per-table-per-request
layout of the write buffer).
"""
from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import time
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer, TopicPartition
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from iox_spark.catalog.sharding import partition_for, topic_for
from tests.project_code import ROOT

CASES_PATH = Path(ROOT).parent / "shared" / "lp" / "cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text().splitlines() if line.strip()]
#: The tag that tells the vectors sharing a table apart.
VECTOR_TAG = "iox_vector"
_UTC0 = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_PY_TYPES = {"float": float, "integer": int, "uinteger": Decimal, "string": str, "boolean": bool}


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _points(case) -> list:
    if case.get("kind") == "batch":
        return case["expect_points"]
    return [case["expect"]] if case["ok"] else []


def _bad_lines(case) -> list:
    """Line numbers the write must reject ([] when every line is good)."""
    if not case["ok"]:
        return [1]
    return [e["line_number"] for e in case.get("errors", [])]


def _accepted(case) -> bool:
    return not _bad_lines(case) and bool(_points(case))


def _vector_id(case) -> str:
    return case["id"].replace("-", "")


def _with_vector_tag(case) -> str:
    """The vector's body with `,iox_vector=<id>` right after the measurement of each point line."""
    out = []
    for line in case["line"].split("\n"):
        rest = line.lstrip(" \t")
        if not rest or rest.startswith("#"):
            out.append(line)
            continue
        j = len(line) - len(rest)
        while j < len(line) and line[j] not in ", \t":  # the measurement ends at an unescaped ',' or ' '
            j += 2 if line[j] == "\\" else 1
        out.append(f"{line[:j]},{VECTOR_TAG}={_vector_id(case)}{line[j:]}")
    return "\n".join(out)


def _columns(points) -> dict:
    """{table: {column: (role, type)}} of the expected points."""
    cols: dict = {}
    for p in points:
        t = cols.setdefault(p["measurement"], {VECTOR_TAG: ("tag", "string"), "time": ("time", "time")})
        for k in p["tags"]:
            t[k] = ("tag", "string")
        for k, (typ, _) in p["fields"].items():
            t[k] = ("field", typ)
    return cols


def _group(cases) -> list:
    """Accepted vectors in groups (one database each) whose tables agree on every column's type."""
    groups: list = []
    for case in cases:
        cols = _columns(_points(case))
        for g in groups:
            if all(g["columns"].get(t, {}).get(k, v) == v for t, cc in cols.items() for k, v in cc.items()):
                break
        else:
            g = {"columns": {}, "cases": []}
            groups.append(g)
        for t, cc in cols.items():
            g["columns"].setdefault(t, {}).update(cc)
        g["cases"].append(case)
    return groups


def _expected_rows(points) -> dict:
    """{table: [(tags, fields, timestamp or None)]} after merging the same (table, tags, time)."""
    merged: dict = {}
    for p in points:
        key = (p["measurement"], frozenset(p["tags"].items()), p["timestamp"])
        merged.setdefault(key, {}).update({k: tuple(v) for k, v in p["fields"].items()})
    out: dict = {}
    for (table, tags, ts), fields in merged.items():
        out.setdefault(table, []).append((dict(tags), fields, ts))
    return out


def _http_write(port: int, org: str, bucket: str, body: bytes, precision: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", f"/api/v2/write?org={org}&bucket={bucket}&precision={precision}", body=body,
                     headers={"Content-Type": "text/plain; charset=utf-8"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


class _Transport:
    """Writes a request body through gRPC or HTTP."""

    def __init__(self, kind: str, client, http_port: int):
        self.kind = kind
        self.client = client
        self.http_port = http_port

    def write(self, db: str, body: str, precision: str):
        """(ok, token or None, failure): failure is ("grpc", RpcError) or ("http", status, json)."""
        raw = body.encode("utf-8")
        if self.kind == "grpc":
            try:
                return True, self.client.write(db, raw, precision=precision), None
            except grpc.RpcError as e:
                return False, None, ("grpc", e)
        org, bucket = db.split("_", 1)
        status, js = _http_write(self.http_port, org, bucket, raw, precision)
        return status == 204, None, (None if status == 204 else ("http", status, js))


def _check_rejection(case, ok, failure, lines):
    cid = case["id"]
    assert not ok, f"{cid}: {case['line']!r} was accepted"
    if failure[0] == "grpc":
        err = failure[1]
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (cid, err.code(), err.details())
        if not lines:
            assert "no points" in err.details(), (cid, err.details())
            return
        status = rpc_status.from_call(err)
        assert status is not None and status.details, (cid, err.details())
        br = error_details_pb2.BadRequest()
        assert status.details[0].Unpack(br), cid
        assert [v.field for v in br.field_violations] == [f"line {n}" for n in lines], (cid, br)
        assert all(v.description for v in br.field_violations), cid
        for n in lines:
            assert f"line {n}" in err.details(), (cid, err.details())
    else:
        _, status, js = failure
        assert status == 400, (cid, status, js)
        assert js["code"] == "invalid", (cid, js)
        if not lines:
            assert "no points" in js["message"], (cid, js)
            return
        assert [e["line"] for e in js["errors"]] == lines, (cid, js)
        for n in lines:
            assert f"line {n}:" in js["message"], (cid, js)


def _assert_topic_empty(bootstrap: str, iox_server, db: str):
    """Nothing of `db` reached Kafka: its topic is absent, or every partition is empty."""
    topic = topic_for(db)
    parts = iox_server.write_buffer.list_database_topics().get(topic)
    if parts is None:
        return
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{db}", "log_level": 3})
    try:
        for p in range(parts):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert hi == 0, f"{topic}[{p}] holds messages up to {hi}"
    finally:
        c.close()


def _typed(value, typ: str):
    assert isinstance(value, _PY_TYPES[typ]), (value, typ)
    if typ == "uinteger":
        assert value == value.to_integral_value(), value
        return int(value)
    return value


def _check_vector(case, table, schema, rows, window):
    """`rows`: the table's rows of this vector; `schema`: the table's {column: (role, type)}."""
    cid = case["id"]
    points = _points(case)
    for name, rt in _columns(points)[table].items():
        assert schema.get(name) == rt, (cid, table, name, schema.get(name), rt)
    tag_cols = [k for k, (role, _) in schema.items() if role == "tag" and k != VECTOR_TAG]
    field_cols = {k: typ for k, (role, typ) in schema.items() if role == "field"}
    got = []
    for r in rows:
        ts = r["time_ns"]
        assert r["time"] == _UTC0 + dt.timedelta(microseconds=ts // 1000), (cid, r)
        tags = {k: r[k] for k in tag_cols if r[k] is not None}
        fields = {k: (typ, _typed(r[k], typ)) for k, typ in field_cols.items() if r[k] is not None}
        got.append((tags, fields, ts))
    want = _expected_rows(points)[table]
    if any(ts is None for _, _, ts in want):
        # a null timestamp is the server's clock during the write (one time for the whole request)
        default_ts = {ts for _, _, ts in got} - {ts for _, _, ts in want if ts is not None}
        assert len(default_ts) == 1, (cid, got, want)
        (server_ts,) = default_ts
        assert window[0] <= server_ts <= window[1], (cid, server_ts, window)
        want = [(tags, fields, server_ts if ts is None else ts) for tags, fields, ts in want]

    def key(row):
        return (row[2], sorted(row[0].items()))

    assert sorted(got, key=key) == sorted(want, key=key), (cid, table)


def _case_collision(case) -> bool:
    """True when a table of the vector has column names that differ only in letter case
    (`F` and `f`, or a field `TIME` next to `time`): Spark resolves names case-insensitively
    unless `spark.sql.caseSensitive` is set."""
    for cols in _columns(_points(case)).values():
        names = [n.lower() for n in list(cols) + ["time_ns", "_iox_seq"]]
        if len(set(names)) != len(names):
            return True
    return False


def _run_transport(kind, client, iox_server, broker, db_prefix, cases, wait=None):
    transport = _Transport(kind, client, iox_server.config.http_port)
    partitions = iox_server.config.partitions
    accepted = [c for c in cases if _accepted(c)]
    rejected = [c for c in cases if not _accepted(c)]

    # 1. rejected vectors: all into one database, which must stay empty
    bad_db = f"{db_prefix}_bad"
    for case in rejected:
        ok, _, failure = transport.write(bad_db, case["line"], case["precision"])
        _check_rejection(case, ok, failure, _bad_lines(case))
    _assert_topic_empty(broker.bootstrap, iox_server, bad_db)
    with pytest.raises(grpc.RpcError) as ei:
        client.status(bad_db)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND

    # 2. accepted vectors: write everything, wait once per database, then read each table once
    groups = _group(accepted)
    windows = {}
    for gi, g in enumerate(groups):
        g["db"] = f"{db_prefix}_ok{gi}"
        g["token"] = {}
        messages = {p: 0 for p in range(partitions)}
        for case in g["cases"]:
            before = time.time_ns()
            ok, token, failure = transport.write(g["db"], _with_vector_tag(case), case["precision"])
            windows[case["id"]] = (before, time.time_ns())
            detail = failure and (failure[1].details() if failure[0] == "grpc" else failure[1:])
            assert ok, (case["id"], case["line"], detail)
            # one message per table per request; a request of several is a transaction: also a
            # commit decision on the highest partition and a marker on each other one with a part
            kps = [partition_for(t, partitions) for t in {p["measurement"] for p in _points(case)}]
            for kp in kps:
                messages[kp] += 1
            if len(kps) > 1:
                for kp in set(kps):
                    messages[kp] += 1
            for p, off in (token or {}).items():
                g["token"][p] = max(g["token"].get(p, -1), off)
        expected = {p: n - 1 for p, n in messages.items() if n}
        if kind == "grpc":
            assert g["token"] == expected  # the layout the HTTP wait relies on
        g["token"] = expected
    for g in groups:
        (wait or (lambda d, t: client.wait_applied(d, t, timeout_s=180)))(g["db"], g["token"])
    failures = []
    checked = 0
    for g in groups:
        st = client.status(g["db"])["databases"][0]
        schemas = {t["name"]: {c["name"]: (c["role"], c["type"]) for c in t["columns"]} for t in st["tables"]}
        assert set(schemas) == set(g["columns"]), (g["db"], sorted(schemas))
        for table, cols in g["columns"].items():
            assert schemas[table] == cols, (g["db"], table, schemas[table], cols)
            ids = [c["id"] for c in g["cases"] if table in {p["measurement"] for p in _points(c)}]
            try:
                rows = client.query(g["db"], f"SELECT * FROM {_quote(table)}").to_pylist()
            except grpc.RpcError as e:
                failures.append(f"{', '.join(ids)} ({table!r}): query failed: {e.code()} {e.details()[:300]}")
                continue
            by_vector: dict = {}
            for r in rows:
                by_vector.setdefault(r[VECTOR_TAG], []).append(r)
            for case in g["cases"]:
                if table not in {p["measurement"] for p in _points(case)}:
                    continue
                try:
                    _check_vector(case, table, cols, by_vector.pop(_vector_id(case), []), windows[case["id"]])
                    checked += 1
                except AssertionError as e:
                    failures.append(f"{case['id']} ({table!r}): {e}")
            assert not by_vector, f"rows of no vector in {table!r}: {by_vector}"
    assert not failures, "\n".join(failures)
    return len(accepted), len(rejected), checked


@pytest.mark.parametrize("kind", ["grpc", "http"])
def test_every_vector(kind, client, iox_server, broker, db):
    cases = [c for c in CASES if not _case_collision(c)]
    n_ok, n_bad, checked = _run_transport(kind, client, iox_server, broker, f"{db}_{kind}", cases)
    assert n_ok + n_bad == len(cases) and len(CASES) - len(cases) <= 3
    assert checked >= n_ok > 80 and n_bad > 50


def test_vectors_with_names_differing_in_case(iox_server, session_tmp, db):
    """The vectors whose column names differ only in case (lp-228: fields `t`, `T`, `true`, `TRUE`...)
    through both transports, on a server of their own (own broker, same Spark application):
    if the server mishandles them, the micro-batch holding them fails again on every retry, and
    that must not stall the session server's write buffer."""
    from iox_spark.server.app import IoxServer
    from iox_spark.server.runtime.broker import start_broker
    from iox_spark.server.api.client import IoxClient
    from tests.conftest import make_config

    cases = [c for c in CASES if _case_collision(c)]
    assert [c["id"] for c in cases] == ["lp-228"]
    b = start_broker()
    srv = IoxServer(make_config(os.path.join(session_tmp, f"case-{db}"), b.bootstrap))
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")

    def wait(database, token):  # fails as soon as the write-buffer stream had to be restarted
        deadline = time.monotonic() + 120
        while True:
            applied = c.applied(database)
            if all(applied.get(int(p), -1) >= off for p, off in token.items()):
                return
            if srv.consumer.restarts:
                err = srv.consumer.last_error or ""
                causes = [ln.strip() for ln in err.splitlines() if "Exception" in ln or "Error" in ln]
                raise AssertionError("the write-buffer stream failed: " + " | ".join(causes[-3:])[:1500])
            assert time.monotonic() < deadline, f"write token {token} not applied (applied: {applied})"
            time.sleep(0.1)

    try:
        c.wait_ready(60)
        for kind in ("grpc", "http"):
            _run_transport(kind, c, srv, b, f"{db}_{kind}", cases, wait)
    finally:
        c.close()
        srv.stop()
        b.stop()
