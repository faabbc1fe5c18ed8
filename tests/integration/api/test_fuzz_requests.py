"""Random and mutated requests through HTTP and gRPC: line protocol, gzip bodies and Arrow IPC
streams. Every answer is a 2xx/4xx (HTTP) or OK / INVALID_ARGUMENT / RESOURCE_EXHAUSTED (gRPC),
never a 500, UNKNOWN, INTERNAL or a crash, the server's resident memory stays bounded, and no
HTTP request costs the server more than `REQUEST_CPU_BOUND_S` of CPU (a bound on the work a
body up to the size cap can cause, e.g. a gzip body of hundreds of thousands of members, not a
speed: CPU time does not grow when the machine is busy).

Runs about a minute with a fixed seed (derandomized); IOX_FUZZ_EXAMPLES=N runs N examples per test
(randomized when IOX_FUZZ_RANDOM=1) for a longer search."""
from __future__ import annotations

import collections
import gzip
import http.client
import os
import time
import uuid

import grpc
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iox_spark.iox import write_pb2
from tests.timestamps import T0

EXAMPLES = int(os.environ.get("IOX_FUZZ_EXAMPLES", "3000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("IOX_FUZZ_RANDOM") != "1",
                suppress_health_check=list(HealthCheck), database=None)
#: growth of the server's (this process's) resident memory allowed over a whole test
RSS_GROWTH_BOUND_BYTES = 1024 * 1024 * 1024
#: CPU (of the process serving the requests, all its threads) one HTTP request may take: linear
#: work on a body up to the 10 MiB cap takes a small part of it; quadratic work on a gzip body of
#: many members took 8.6 s at 200,000 members
REQUEST_CPU_BOUND_S = 3.0
GRPC_OK = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
DB = f"fuzz_{uuid.uuid4().hex[:8]}"
#: answers seen per test: both accepted and refused requests must occur
SEEN: dict = collections.defaultdict(collections.Counter)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module")
def fuzz_server(session_tmp):
    """A server on an in-memory broker of its own: what the fuzzing writes (random tables and
    columns by the thousand) never reaches the session server, whose consumer later tests share."""
    from iox_spark.server.api.client import IoxClient
    from iox_spark.server.app import IoxServer
    from iox_spark.server.runtime.broker import free_port, start_broker
    from tests.conftest import make_config

    b = start_broker(free_port())
    srv = IoxServer(make_config(os.path.join(session_tmp, f"fuzz-{uuid.uuid4().hex[:6]}"), b.bootstrap))
    try:
        srv.start()
        c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
        c.wait_ready(60)
        yield srv, c
        c.close()
    finally:
        srv.stop()
        b.stop()


@pytest.fixture
def rss_bound():
    before = _rss()
    yield
    assert _rss() - before < RSS_GROWTH_BOUND_BYTES


VALID_LINES = [b"cpu,host=a,region=eu usage=1.5,idle=3i 1700000000000000000\n",
               b'mem,host=b used=12u,free=t,note="x y" 1700000000000000001\n',
               b"disk v=1\n", b"cpu\\ x,t\\,a=b\\=c f=-1.0e3 1700000000000000002\n"]


@st.composite
def line_protocol(draw) -> bytes:
    base = b"".join(draw(st.lists(st.sampled_from(VALID_LINES), min_size=1, max_size=8)))
    if draw(st.booleans()):
        return draw(st.binary(max_size=2048))
    data = bytearray(base)
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "dup"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and data:
            del data[i:i + draw(st.integers(1, 8))]
        elif op == "dup":
            data += data[:draw(st.integers(0, 64))] * draw(st.integers(1, 4))
    return bytes(data)


@st.composite
def arrow_ipc(draw) -> tuple[bytes, list]:
    n = draw(st.integers(0, 50))
    cols = {"time": pa.array([T0 + i for i in range(n)], draw(st.sampled_from([pa.int64(), pa.timestamp("ns"),
                                                                                 pa.timestamp("s")])))}
    roles = [("time", write_pb2.ColumnRole.TIME)]
    if draw(st.booleans()):
        values = draw(st.lists(st.text(max_size=20), min_size=1, max_size=5))
        cols["host"] = pa.DictionaryArray.from_arrays(pa.array([i % len(values) for i in range(n)], pa.int32()),
                                                      pa.array(values))
        roles.append(("host", write_pb2.ColumnRole.TAG))
    cols["v"] = pa.array([float(i) for i in range(n)])
    roles.append(("v", draw(st.sampled_from([write_pb2.ColumnRole.FIELD, write_pb2.ColumnRole.TAG,
                                             write_pb2.ColumnRole.ROLE_UNSPECIFIED]))))
    t = pa.table(cols)
    sink = pa.BufferOutputStream()
    opts = pa.ipc.IpcWriteOptions(compression=draw(st.sampled_from([None, "zstd", "lz4"])))
    with pa.ipc.new_stream(sink, t.schema, options=opts) as w:
        w.write_table(t)
    data = bytearray(sink.getvalue().to_pybytes())
    for _ in range(draw(st.integers(0, 6))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "truncate", "insert"]))
        if op == "flip":
            data[i] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[i:]
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data), roles


def _http(port: int, body: bytes, gz: bool, path: str) -> int:
    """The status of one request; asserts the CPU it cost this process (the server's) is bounded."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Encoding": "gzip"} if gz else {}
    cpu0 = time.process_time()
    conn.request("POST", path, body=body, headers=headers)
    r = conn.getresponse()
    r.read()
    cpu_s = time.process_time() - cpu0
    conn.close()
    assert cpu_s < REQUEST_CPU_BOUND_S, (cpu_s, len(body), path)
    return r.status


@FUZZ
@given(body=line_protocol(), gz=st.sampled_from(["no", "gzip", "corrupt"]),
       path=st.sampled_from([f"/api/v2/write?org=fuzz&bucket={DB}", f"/write?db={DB}",
                             f"/api/v2/write?org=fuzz&bucket={DB}&precision=s", "/write?db=b%21d"]))
def _fuzz_http(port, body, gz, path):
    if gz != "no":
        body = gzip.compress(body)
        if gz == "corrupt":
            body = body[: len(body) // 2] + bytes(reversed(body[len(body) // 2:]))
    status = _http(port, body, gz != "no", path)
    SEEN["http"][status // 100] += 1
    assert 200 <= status < 500, status


def test_fuzz_http_line_protocol_and_gzip(fuzz_server, rss_bound):
    _fuzz_http(fuzz_server[0].http.port)
    assert SEEN["http"][2] and SEEN["http"][4], SEEN["http"]


#: one gzip member with nothing in it (20 bytes), and the most of them a body under the cap holds
_EMPTY_MEMBER = gzip.compress(b"")
_MAX_MEMBERS = (10 * 1024 * 1024) // len(_EMPTY_MEMBER)


@settings(FUZZ, max_examples=max(6, EXAMPLES // 250))
@given(members=st.integers(1, _MAX_MEMBERS), lines=st.lists(st.sampled_from(VALID_LINES), max_size=4),
       at=st.floats(0, 1), tail=st.sampled_from([b"", b"\x1f\x8b", b"junk"]))
def _fuzz_gzip_members(port, members, lines, at, tail):
    """A body of many gzip members (empty ones, valid lines in one of them, maybe a bad tail)."""
    i = int(at * members)
    body = _EMPTY_MEMBER * i + gzip.compress(b"".join(lines)) + _EMPTY_MEMBER * (members - i) + tail
    status = _http(port, body, True, f"/api/v2/write?org=fuzz&bucket={DB}")
    SEEN["gzip members"][status // 100] += 1
    assert 200 <= status < 500, status


def test_fuzz_http_gzip_bodies_of_many_members(fuzz_server, rss_bound):
    _fuzz_gzip_members(fuzz_server[0].http.port)
    assert SEEN["gzip members"][2] and SEEN["gzip members"][4], SEEN["gzip members"]


@FUZZ
@given(body=line_protocol(), precision=st.sampled_from(["", "ns", "s", "bogus"]))
def _fuzz_grpc_lp(client, body, precision):
    try:
        client.write_stub.Write(write_pb2.WriteRequest(database=DB, line_protocol=body, precision=precision),
                                timeout=60)
        SEEN["lp"][grpc.StatusCode.OK] += 1
    except grpc.RpcError as e:
        SEEN["lp"][e.code()] += 1
        assert e.code() in GRPC_OK, (e.code(), e.details())


def test_fuzz_grpc_line_protocol(fuzz_server, rss_bound):
    _fuzz_grpc_lp(fuzz_server[1])
    assert SEEN["lp"][grpc.StatusCode.OK] and SEEN["lp"][grpc.StatusCode.INVALID_ARGUMENT], SEEN["lp"]


@FUZZ
@given(stream=arrow_ipc(), table=st.sampled_from(["m", "m2", "", "x" * 300]))
def _fuzz_grpc_arrow(client, stream, table):
    ipc, roles = stream
    req = write_pb2.WriteArrowRequest(database=DB)
    t = req.tables.add(table=table, arrow_ipc=ipc)
    for name, role in roles:
        t.columns.add(name=name, role=role)
    try:
        client.write_stub.WriteArrow(req, timeout=60)
        SEEN["arrow"][grpc.StatusCode.OK] += 1
    except grpc.RpcError as e:
        SEEN["arrow"][e.code()] += 1
        assert e.code() in GRPC_OK, (e.code(), e.details())


def test_fuzz_grpc_arrow(fuzz_server, rss_bound):
    _fuzz_grpc_arrow(fuzz_server[1])
    assert SEEN["arrow"][grpc.StatusCode.OK] and SEEN["arrow"][grpc.StatusCode.INVALID_ARGUMENT], SEEN["arrow"]
