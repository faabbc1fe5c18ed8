"""Bounded requests: request size (gRPC message limit, Arrow decompression and dictionary
expansion), concurrency (gRPC maximum_concurrent_rpcs, the HTTP worker pool) and query result
limits, each answered with its exact status. One extra server with small limits for the module."""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import grpc
import pyarrow as pa
import pytest

from iox_spark.iox import query_pb2, write_pb2
from iox_spark.server.api.client import IoxClient
from iox_spark.server.api.grpc_services import REQUEST_FRAMING_BYTES
from tests.conftest import make_config
from tests.waiting import wait_for
from tests.timestamps import T0

MAX_REQUEST = 64 * 1024
MAX_RPCS = 3
HTTP_WORKERS = 1
MAX_ROWS = 10
MAX_QUERY_BYTES = 16 * 1024


@pytest.fixture(scope="module")
def small(own_broker, session_tmp, iox_server):
    from iox_spark.server.app import IoxServer

    cfg = make_config(os.path.join(session_tmp, f"bounds-{uuid.uuid4().hex[:6]}"), own_broker.bootstrap,
                      max_request_bytes=MAX_REQUEST, grpc_workers=2, max_concurrent_rpcs=MAX_RPCS,
                      http_workers=HTTP_WORKERS, max_query_rows=MAX_ROWS, max_query_bytes=MAX_QUERY_BYTES)
    srv = IoxServer(cfg)
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    c.wait_ready(60)
    yield srv, c
    c.close()
    srv.stop()


def _db():
    return f"b_{uuid.uuid4().hex[:10]}"


def _write_visible(c, db, rows: int) -> None:
    c.write(db, "".join(f"cpu,host=h{i} v={i} {T0 + i}\n" for i in range(rows)))
    wait_for(lambda: c.query(db, "SELECT count(*) AS n FROM cpu").column("n").to_pylist() == [rows], 60,
             "the rows are visible")


def _ipc(table: pa.Table, **opts) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(**opts)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _write_arrow(c, db, ipc: bytes, roles):
    req = write_pb2.WriteArrowRequest(database=db)
    t = req.tables.add(table="m", arrow_ipc=ipc)
    for name, role in roles:
        t.columns.add(name=name, role=role)
    return c.write_stub.WriteArrow(req, timeout=60)


def _code(fn, *a, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        fn(*a, **kw)
    return ei.value


# -- request size --------------------------------------------------------------------------

def test_grpc_message_over_the_limit_is_refused_by_grpc_without_reading_it(small):
    srv, c = small
    body = b"x" * (MAX_REQUEST + REQUEST_FRAMING_BYTES + 1)
    e = _code(c.write, _db(), body)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(MAX_REQUEST + REQUEST_FRAMING_BYTES) in e.details()


def test_grpc_write_between_the_limit_and_the_framing_is_refused_by_the_router(small):
    srv, c = small
    e = _code(c.write, _db(), b"x" * (MAX_REQUEST + 1))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"limit of {MAX_REQUEST} bytes" in e.details()


def test_compressed_arrow_stream_is_checked_after_decompression(small):
    srv, c = small
    n = 200_000  # 3.2 MB decoded, a few KB compressed
    t = pa.table({"time": pa.array([T0] * n, pa.int64()), "v": pa.array([1.0] * n)})
    ipc = _ipc(t, compression="zstd")
    assert len(ipc) < MAX_REQUEST
    e = _code(_write_arrow, c, _db(), ipc, [("time", write_pb2.ColumnRole.TIME), ("v", write_pb2.ColumnRole.FIELD)])
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"limit of {MAX_REQUEST} bytes after decompression" in e.details()


def test_dictionary_tag_is_checked_expanded(small):
    srv, c = small
    n = 2000
    tags = pa.DictionaryArray.from_arrays(pa.array([i % 10 for i in range(n)], pa.int8()),
                                          pa.array([f"{i}" + "x" * 200 for i in range(10)]))
    t = pa.table({"time": pa.array(range(T0, T0 + n), pa.int64()), "host": tags, "v": pa.array([1.0] * n)})
    ipc = _ipc(t)
    assert len(ipc) < MAX_REQUEST
    roles = [("time", write_pb2.ColumnRole.TIME), ("host", write_pb2.ColumnRole.TAG),
             ("v", write_pb2.ColumnRole.FIELD)]
    e = _code(_write_arrow, c, _db(), ipc, roles)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"limit of {MAX_REQUEST} bytes" in e.details()
    # the same dictionary, few rows: accepted
    r = _write_arrow(c, _db(), _ipc(t.slice(0, 20)), roles)
    assert r.points == 20


def test_http_gzip_over_the_limit_is_413(small):
    import gzip
    import http.client

    srv, c = small
    body = gzip.compress(b"m v=1 1\n" * (MAX_REQUEST // 4))
    conn = http.client.HTTPConnection("127.0.0.1", srv.http.port, timeout=30)
    conn.request("POST", f"/api/v2/write?org=o&bucket=b&precision=s", body=body,
                 headers={"Content-Encoding": "gzip"})
    r = conn.getresponse()
    assert r.status == 413, r.read()
    conn.close()


# -- concurrency ---------------------------------------------------------------------------

def test_grpc_beyond_max_concurrent_rpcs_is_resource_exhausted(small):
    srv, c = small
    release = threading.Event()
    entered = threading.Semaphore(0)
    real_run = srv.query_engine.run

    def slow_run(database, sql):
        if database == "slow":
            entered.release()
            release.wait(30)
        return real_run(database, sql)

    srv.query_engine.run = slow_run
    codes = []

    def call():
        try:
            list(c.query_stub.Query(query_pb2.QueryRequest(database="slow", sql="SELECT 1"), timeout=60))
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())

    threads = [threading.Thread(target=call) for _ in range(MAX_RPCS)]
    try:
        for t in threads:
            t.start()
        # the pool has 2 threads: 2 RPCs run, the third waits for a thread (still in progress)
        assert entered.acquire(timeout=30) and entered.acquire(timeout=30)
        # the third is admitted (counted against --max-concurrent-rpcs) once grpc counts it active
        state = srv.grpc._state  # grpc's own count: the one maximum_concurrent_rpcs is checked against
        wait_for(lambda: state.active_rpc_count >= MAX_RPCS, 30, "the third RPC admitted")
        e = _code(lambda: list(c.query_stub.Query(query_pb2.QueryRequest(database="slow", sql="SELECT 1"),
                                                  timeout=30)))
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        release.set()
        for t in threads:
            t.join(60)
        srv.query_engine.run = real_run
    assert len(codes) == MAX_RPCS and grpc.StatusCode.RESOURCE_EXHAUSTED not in codes


def test_http_beyond_the_worker_pool_is_503_with_retry_after(small):
    srv, c = small
    port = srv.http.port
    # connections that send nothing: first one per worker (each serving one), then as many waiting;
    # opened in two steps, each awaited (connections accepted before a worker took the earlier ones
    # would find the queue full and be answered 503 themselves)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(HTTP_WORKERS)]
    try:
        wait_for(lambda: srv.http.busy_workers == HTTP_WORKERS, 10, "every HTTP worker to serve a connection")
        held += [socket.create_connection(("127.0.0.1", port)) for _ in range(HTTP_WORKERS)]
        wait_for(lambda: srv.http.connections_waiting == HTTP_WORKERS, 10, "the queue to fill")
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        head = data.split(b"\r\n\r\n")[0].decode()
        assert head.startswith("HTTP/1.1 503"), head
        assert "Retry-After: 1" in head
    finally:
        for h in held:
            h.close()
    # the pool is free again: served
    import http.client

    deadline = time.monotonic() + 30
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        conn.close()
        if r.status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status == 200


# -- query results -------------------------------------------------------------------------

def test_query_over_max_rows_is_resource_exhausted(small):
    srv, c = small
    db = _db()
    _write_visible(c, db, 3 * MAX_ROWS)
    e = _code(c.query, db, "SELECT * FROM cpu")
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"limit of {MAX_ROWS} rows (--max-query-rows)" in e.details()
    assert c.query(db, f"SELECT * FROM cpu ORDER BY time LIMIT {MAX_ROWS}").num_rows == MAX_ROWS


@pytest.mark.parametrize("sql", ["SELECT repeat(host, 2000) AS s FROM cpu",
                                 "SELECT repeat(host, 2000) AS s, count(*) AS n FROM cpu GROUP BY s"])
def test_query_over_max_bytes_is_resource_exhausted(small, sql):
    srv, c = small
    db = _db()
    _write_visible(c, db, MAX_ROWS)
    e = _code(c.query, db, sql)
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"limit of {MAX_QUERY_BYTES} bytes (--max-query-bytes)" in e.details()
