"""Unit tests for server.api.http_api: gzip with a limit, the error mapping, and the HTTP
handler against a fake router (no broker, no Spark)."""
from __future__ import annotations

import csv
import gzip
import http.client
import io
import json
import random
import socket
import zlib
from types import SimpleNamespace

import pytest

from iox_spark.server.runtime.broker import free_port
from iox_spark.server.errors import (BadLines, DatabaseFenced, DatabaseNotFound, DecompressedRequestTooLarge, InvalidArgument,
                           InvalidDatabaseName, RequestTooLarge, SchemaConflict, WriteBufferUnavailable)
from iox_spark.server.api.http_api import (HttpWriteServer, compressed_cap, database_for, database_for_v1, error_response,
                             error_response_v1, gunzip_limited, precision_for_v1)
from iox_spark.server.write.line_protocol import ALL_PRECISIONS, PRECISIONS
from iox_spark.server.write.router import WriteResult
from iox_spark.server.write_buffer.write_token import WriteToken, parse_token
from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.sharding import topic_for


# -- gunzip_limited --------------------------------------------------------------------

def test_gunzip_round_trip_and_multi_member():
    assert gunzip_limited(gzip.compress(b"abc"), 10) == b"abc"
    assert gunzip_limited(gzip.compress(b"ab") + gzip.compress(b"cd"), 10) == b"abcd"
    assert gunzip_limited(gzip.compress(b""), 10) == b""


def test_gunzip_exactly_at_the_limit_is_fine_one_more_byte_is_not():
    assert gunzip_limited(gzip.compress(b"x" * 100), 100) == b"x" * 100
    with pytest.raises(DecompressedRequestTooLarge) as ei:
        gunzip_limited(gzip.compress(b"x" * 101), 100)
    assert ei.value.limit_bytes == 100 and "100 bytes" in str(ei.value)
    # over the limit only across members
    with pytest.raises(DecompressedRequestTooLarge):
        gunzip_limited(gzip.compress(b"x" * 60) + gzip.compress(b"y" * 60), 100)


def test_gunzip_bomb_stops_at_the_limit():
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)  # 64 MiB in ~64 KiB
    assert len(bomb) < 100_000
    with pytest.raises(DecompressedRequestTooLarge) as ei:
        gunzip_limited(bomb, 1 << 20)
    assert isinstance(ei.value, RequestTooLarge)


# mtime=0: a gzip header holds the time it was made, and the test ids must be the same in every
# pytest process that collects them (scripts/test.sh runs several)
@pytest.mark.parametrize("body", [b"plain text", gzip.compress(b"abcdef", mtime=0)[:-4],
                                  gzip.compress(b"abc", mtime=0) + b"junk", b""],
                         ids=["plain", "truncated", "trailing-junk", "empty"])
def test_gunzip_corrupt_or_truncated_is_invalid_argument(body):
    with pytest.raises(InvalidArgument) as ei:
        gunzip_limited(body, 1000)
    assert "gzip" in str(ei.value)


def test_gunzip_members_of_any_size_across_the_pieces_it_reads():
    rng = random.Random(7)
    parts = [rng.randbytes(rng.choice([0, 1, 50, 4095, 4096, 9000])) for _ in range(60)]
    body = b"".join(gzip.compress(p, compresslevel=rng.choice([0, 6])) for p in parts)
    assert gunzip_limited(body, 1 << 20) == b"".join(parts)


def test_gunzip_of_many_members_takes_time_linear_in_the_body():
    """200k empty members (4 MiB; 10 MiB bodies allow ~530k): each member used to copy the rest of
    the body (8.6 s for 200k); read in pieces it is linear. The bound is a complexity check with a
    wide margin (about 1 s of CPU here), not a speed figure."""
    import time

    body = gzip.compress(b"") * 200_000
    t0 = time.process_time()
    assert gunzip_limited(body, 1 << 20) == b""
    assert time.process_time() - t0 < 5.0


def test_compressed_cap_covers_incompressible_data():
    data = random.Random(0).randbytes(1 << 20)  # 1 MiB that deflate cannot shrink
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    gz = z.compress(data) + z.flush()
    assert len(gz) > len(data) and len(gz) <= compressed_cap(len(data))


# -- error mapping ---------------------------------------------------------------------

def test_error_response_mapping():
    st, headers, body = error_response(BadLines([(2, "bad field"), (7, "no fields")], 150))
    assert st == 400 and body["code"] == "invalid" and body["line"] == 2
    assert "line 2: bad field" in body["message"] and "line 7: no fields" in body["message"]
    assert "148 more" in body["message"]
    assert body["errors"] == [{"line": 2, "message": "bad field"}, {"line": 7, "message": "no fields"}]
    for err in (InvalidArgument("x"), InvalidDatabaseName("a b", "bad"), SchemaConflict("t", "c", "tag", "float field")):
        assert error_response(err)[0] == 400 and error_response(err)[2]["code"] == "invalid"
    assert error_response(SchemaConflict("t", "c", "tag", "float field"))[2]["message"].count("'c'") == 1
    assert error_response(RequestTooLarge(11, 10))[0] == 413
    assert error_response(DecompressedRequestTooLarge(10))[0] == 413
    assert error_response(DatabaseNotFound("d"))[0] == 404
    st, headers, body = error_response(WriteBufferUnavailable("down", retry_after_s=2.5))
    assert st == 503 and ("Retry-After", "3") in headers and body["code"] == "unavailable"
    assert ("Retry-After", "1") in error_response(WriteBufferUnavailable("down", retry_after_s=0.1))[1]
    from iox_spark.server.errors import ColumnAgreementUnavailable, OwnerNotCaughtUp, OwnershipMoving

    for err in (OwnerNotCaughtUp("d", "a", {1: (3, 5)}, 2.0), OwnershipMoving("d", "b: not the owner"),
                ColumnAgreementUnavailable("d", "timeout")):  # an ingester pool's: retry
        st, headers, body = error_response(err)
        assert st == 503 and ("Retry-After", "1") in headers and body["code"] == "unavailable", err
    assert error_response(RuntimeError("boom"))[0] == 500


def test_a_fenced_database_is_a_conflict_naming_the_revision():
    st, headers, body = error_response(DatabaseFenced("mydb", 7))
    assert st == 409 and headers == [] and body["code"] == "conflict"
    assert "'mydb'" in body["message"] and "revision 7" in body["message"]


def test_database_for():
    assert database_for("my-org", "my_bucket") == "my-org_my_bucket"


# -- the handler, against a fake router ------------------------------------------------

class FakeRouter:
    def __init__(self, limit=1000):
        self.max_request_bytes = limit
        self.calls = []
        self.raise_next = None
        self.catalog = Catalog()  # the real in-memory catalog: the write token's epoch and topic

    def write_line_protocol(self, database, body, precision="ns", precisions=PRECISIONS):
        if len(body) > self.max_request_bytes:  # as the real router does
            raise RequestTooLarge(len(body), self.max_request_bytes)
        if self.raise_next is not None:
            e, self.raise_next = self.raise_next, None
            raise e
        if precision not in precisions:
            raise InvalidArgument(f"precision {precision!r}")
        self.calls.append((database, body, precision))
        self.catalog.ensure_database(database, topic_for(database), 4)
        return WriteResult({1: len(self.calls) + 40}, 1, topic_for(database))


@pytest.fixture
def served():
    router = FakeRouter()
    srv = HttpWriteServer(router, "127.0.0.1", free_port())
    srv.start()
    yield router, srv.port
    srv.stop()


@pytest.mark.parametrize("host,clients", [("::1", ["::1"]), ("::", ["::1", "127.0.0.1"])])
def test_an_ipv6_bind_host_serves_ipv6_and_the_wildcard_ipv4_too(host, clients):
    if not socket.has_ipv6:
        pytest.fail("this machine has no IPv6: the test cannot run")
    router = FakeRouter()
    srv = HttpWriteServer(router, host, free_port())
    srv.start()
    try:
        for i, client in enumerate(clients):
            conn = http.client.HTTPConnection(client, srv.port, timeout=10)
            assert _req(conn, "POST", "/api/v2/write?org=o&bucket=b", f"m v={i} {i}".encode())[0] == 204
            conn.close()
        assert [c[1] for c in router.calls] == [f"m v={i} {i}".encode() for i in range(len(clients))]
    finally:
        srv.stop()


def _req(conn, method, path, body=b"", headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def test_write_maps_org_bucket_precision_and_keeps_the_connection(served):
    router, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    assert _req(conn, "POST", "/api/v2/write?org=o&bucket=b&precision=ms", b"m v=1 1")[0] == 204
    assert _req(conn, "POST", "/api/v2/write?orgID=abc&bucket=b", b"m v=2 2")[0] == 204
    gz = gzip.compress(b"m v=3 3")
    assert _req(conn, "POST", "/api/v2/write?org=o&bucket=b", gz, {"Content-Encoding": "gzip"})[0] == 204
    assert router.calls == [("o_b", b"m v=1 1", "ms"), ("abc_b", b"m v=2 2", "ns"), ("o_b", b"m v=3 3", "ns")]
    conn.close()


def test_a_write_answers_its_printable_token_in_a_header(served):
    router, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    status, headers, _ = _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"m v=1 1")
    assert status == 204
    assert parse_token(headers["x-iox-write-token"]) == WriteToken(topic_for("o_b"), None, 0, {1: 41})
    status, headers, _ = _req(conn, "POST", "/write?db=x", b"m v=1 1")  # InfluxDB 1.x too
    assert status == 204 and parse_token(headers["x-iox-write-token"]).offsets == {1: 42}
    conn.close()


def test_errors_over_http(served):
    router, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    router.raise_next = BadLines([(1, "nope")], 1)
    st, h, body = _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"x")
    assert st == 400 and json.loads(body)["errors"] == [{"line": 1, "message": "nope"}]
    router.raise_next = WriteBufferUnavailable("broker down")
    st, h, body = _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"m v=1")
    assert st == 503 and h["retry-after"] == "1" and "broker down" in json.loads(body)["message"]
    router.raise_next = RuntimeError("boom")
    st, h, body = _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"m v=1")
    assert st == 500 and json.loads(body)["code"] == "internal error"
    # over the limit: the body is drained, the answer is 413, the connection still works
    st, h, body = _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"m v=1\n" * 200)
    assert st == 413 and "1000" in json.loads(body)["message"]
    st, h, body = _req(conn, "POST", "/api/v2/write?org=o&bucket=b", gzip.compress(b"m v=1\n" * 2000),
                       {"Content-Encoding": "gzip"})
    assert st == 413 and "after decompression" in json.loads(body)["message"]
    assert _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"m v=1")[0] == 204
    assert _req(conn, "POST", "/api/v2/write?bucket=b", b"m v=1")[0] == 400
    assert _req(conn, "POST", "/api/v2/write?org=o", b"m v=1")[0] == 400
    assert _req(conn, "POST", "/api/v2/write?org=o&bucket=b", b"m v=1", {"Content-Encoding": "br"})[0] == 400
    assert _req(conn, "POST", "/nope", b"x")[0] == 404
    assert _req(conn, "POST", "/ping", b"")[0] == 405
    assert _req(conn, "GET", "/api/v2/write")[0] == 405
    conn.close()


def _raw(port, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def test_chunked_bodies(served):
    router, port = served
    head = b"POST /api/v2/write?org=o&bucket=b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    resp = _raw(port, head + b"4\r\nm v=\r\n3\r\n1 5\r\n0\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 204"), resp
    assert router.calls[-1] == ("o_b", b"m v=1 5", "ns")
    big = b"".join(b"64\r\n" + b"x" * 100 + b"\r\n" for _ in range(11)) + b"0\r\n\r\n"  # 1100 > 1000 bytes
    assert _raw(port, head + big).startswith(b"HTTP/1.1 413")
    assert _raw(port, head + b"zz\r\n").startswith(b"HTTP/1.1 400")


def test_expect_100_continue(served):
    router, port = served
    head = "POST /api/v2/write?org=o&bucket=b HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n"
    assert _raw(port, head.format(10 ** 9).encode()).startswith(b"HTTP/1.1 413")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head.format(7).encode())
        assert s.recv(1024).startswith(b"HTTP/1.1 100")
        s.sendall(b"m v=1 9")
        assert s.recv(1024).startswith(b"HTTP/1.1 204")
    assert router.calls[-1] == ("o_b", b"m v=1 9", "ns")


def test_health_and_ping(served):
    _, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    st, h, body = _req(conn, "GET", "/health")
    assert st == 200 and json.loads(body)["status"] == "pass"
    st, h, body = _req(conn, "GET", "/ping")
    assert st == 204 and body == b"" and "x-influxdb-version" in h
    assert _req(conn, "HEAD", "/ping")[0] == 204
    assert _req(conn, "GET", "/ready")[0] == 200
    conn.close()


# -- InfluxDB 1.x ----------------------------------------------------------------------

def test_database_and_precision_for_v1():
    assert database_for_v1("telegraf") == "telegraf"
    assert database_for_v1("telegraf", "autogen") == "telegraf"
    assert database_for_v1("telegraf", "weekly") == "telegraf_weekly"
    with pytest.raises(InvalidArgument):
        database_for_v1("", "autogen")
    assert [precision_for_v1(p) for p in ("", "n", "ns", "u", "us", "ms", "s", "m", "h")] == [
        "ns", "ns", "ns", "us", "us", "ms", "s", "m", "h"]
    assert set(map(precision_for_v1, ("n", "u", "ms", "s", "m", "h"))) == set(ALL_PRECISIONS)
    for bad in ("x", "d", "rfc3339", "NS"):
        with pytest.raises(InvalidArgument):
            precision_for_v1(bad)


def test_error_response_v1_is_the_same_status_with_an_error_body():
    for err in (BadLines([(2, "bad field")], 1), InvalidDatabaseName("a.b", "bad"), RequestTooLarge(11, 10),
                DatabaseNotFound("d"), DatabaseFenced("d", 3), WriteBufferUnavailable("down", retry_after_s=2),
                RuntimeError("boom")):
        st, headers, body = error_response(err)
        assert error_response_v1(err) == (st, headers, {"error": body["message"]})


def test_v1_write_maps_db_rp_precision_and_ignores_credentials(served):
    router, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    basic = {"Authorization": "Basic cm9vdDpyb290"}
    assert _req(conn, "POST", "/write?db=telegraf", b"m v=1 1")[0] == 204
    assert _req(conn, "POST", "/write?db=telegraf&rp=weekly&precision=s&u=root&p=secret", b"m v=2 2", basic)[0] == 204
    assert _req(conn, "POST", "/write?db=d&precision=n&consistency=one", b"m v=3 3",
                {"Authorization": "Token abc"})[0] == 204
    for p, want in (("u", "us"), ("us", "us"), ("ms", "ms"), ("m", "m"), ("h", "h"), ("", "ns")):
        assert _req(conn, "POST", f"/write/?db=d&precision={p}", b"m v=4 4")[0] == 204
        assert router.calls[-1] == ("d", b"m v=4 4", want)
    gz = gzip.compress(b"m v=5 5")
    assert _req(conn, "POST", "/write?db=d", gz, {"Content-Encoding": "gzip"})[0] == 204
    assert router.calls[:3] == [("telegraf", b"m v=1 1", "ns"), ("telegraf_weekly", b"m v=2 2", "s"),
                                ("d", b"m v=3 3", "ns")]
    assert router.calls[-1] == ("d", b"m v=5 5", "ns")
    conn.close()


def test_v1_errors_are_json_error_bodies_with_the_v2_statuses(served):
    router, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def err(path, body=b"m v=1", headers=None, status=400):
        st, h, raw = _req(conn, "POST", path, body, headers)
        assert st == status and h["content-type"].startswith("application/json"), (st, raw)
        out = json.loads(raw)
        assert list(out) == ["error"] and out["error"], out
        return out["error"], h

    assert "db" in err("/write")[0]
    assert "precision" in err("/write?db=d&precision=x")[0]
    router.raise_next = BadLines([(1, "nope")], 1)
    assert "line 1: nope" in err("/write?db=d")[0]
    router.raise_next = WriteBufferUnavailable("broker down")
    msg, h = err("/write?db=d", status=503)
    assert "broker down" in msg and h["retry-after"] == "1"
    router.raise_next = DatabaseNotFound("d")
    err("/write?db=d", status=404)
    router.raise_next = DatabaseFenced("d", 2)
    err("/write?db=d", status=409)
    router.raise_next = RuntimeError("boom")
    assert "internal error" in err("/write?db=d", status=500)[0]
    # over the limit, before and after decompression: 413, the connection still works
    assert "1000" in err("/write?db=d", b"m v=1\n" * 200, status=413)[0]
    assert "after decompression" in err("/write?db=d", gzip.compress(b"m v=1\n" * 2000), {"Content-Encoding": "gzip"},
                                        status=413)[0]
    assert "Content-Encoding" in err("/write?db=d", headers={"Content-Encoding": "br"})[0]
    assert _req(conn, "POST", "/write?db=d", b"m v=1")[0] == 204
    st, h, raw = _req(conn, "GET", "/write?db=d")
    assert st == 405 and h["allow"] == "POST" and "POST /write" in json.loads(raw)["error"]
    conn.close()
    head = b"POST /write?db=d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head % 10 ** 9)
        resp = b""
        while chunk := s.recv(65536):  # the server closes the connection after its answer
            resp += chunk
    assert resp.startswith(b"HTTP/1.1 413") and b'{"error": ' in resp


def test_v1_ping_204_or_verbose_200(served):
    _, port = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for method in ("GET", "HEAD"):
        st, h, body = _req(conn, method, "/ping")
        assert st == 204 and body == b"" and "content-type" not in h
        assert h["x-influxdb-version"] and h["x-influxdb-build"] == "OSS"
        for quiet in ("false", "0", ""):
            assert _req(conn, method, f"/ping?verbose={quiet}")[0] == 204
    st, h, body = _req(conn, "GET", "/ping?verbose=true")
    assert st == 200 and json.loads(body) == {"version": h["x-influxdb-version"]}
    assert _req(conn, "HEAD", "/ping?verbose=1")[:3:2] == (200, b"")
    conn.close()


# -- SQL queries (server/api/http_query.py), against a fake query function ------------------

class _Result:
    """A QueryResult's surface: `rows` in batches of `per_batch`; `fail_after` batches, then `fail` raised."""

    def __init__(self, rows, per_batch=1000, fail_after=None, fail=None):
        import pyarrow as pa

        self.table = pa.Table.from_pylist(rows)
        self.schema = self.table.schema
        self._per_batch, self._fail_after, self._fail = per_batch, fail_after, fail
        self.applied_hi_inclusive, self.visible_hi_inclusive = {0: 4, 1: -1}, {0: 6, 1: -1}
        self.partial, self.topic, self.topic_id, self.epoch = True, "iox_d", "id-1", 3
        self.closed = False

    def batches(self):
        try:
            for i, b in enumerate(self.table.to_batches(max_chunksize=self._per_batch)):
                if i == self._fail_after:
                    raise self._fail
                yield b
        finally:
            self.closed = True


def test_a_query_answers_json_rows_and_says_what_it_reflects_in_headers():
    from iox_spark.server.errors import ReplayNotCaughtUp, WriteTokenNotVisible

    calls = []

    def query(database, sql, after, allow_partial, deadline_s):
        calls.append((database, sql, after, allow_partial, deadline_s))
        if sql == "slow":
            raise WriteTokenNotVisible(database, {0: 9}, {0: 6}, 1.0)
        if sql == "replaying":
            raise ReplayNotCaughtUp(database, 1, 4, 2.0)
        return _Result([{"v": 1.5, "n": float("nan"), "s": "x"}])

    srv = HttpWriteServer(FakeRouter(), "127.0.0.1", free_port())
    srv.queries = SimpleNamespace(query=query)
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        status, headers, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=SELECT%20v%20FROM%20m", headers={
            "X-Iox-After": "wt1.abc", "X-Iox-Allow-Partial": "true", "X-Iox-Timeout-S": "7"})
        assert status == 200 and json.loads(body) == [{"v": 1.5, "n": None, "s": "x"}]
        assert calls == [("d", "SELECT v FROM m", "wt1.abc", True, 7.0)]
        assert (json.loads(headers["x-iox-applied-hi-inclusive"]), json.loads(headers["x-iox-visible-hi-inclusive"]),
                headers["x-iox-partial"], headers["x-iox-topic"], headers["x-iox-topic-id"], headers["x-iox-epoch"]) \
            == ({"0": 4, "1": -1}, {"0": 6, "1": -1}, "true", "iox_d", "id-1", "3")
        assert _req(conn, "GET", "/api/v3/query_sql?db=d&q=slow")[0] == 504
        status, headers, _ = _req(conn, "GET", "/api/v3/query_sql?db=d&q=replaying")
        assert status == 503 and headers["retry-after"] == "1"
        for path, hdrs in (("/api/v3/query_sql?q=x", {}), ("/api/v3/query_sql?db=d", {}),
                           ("/api/v3/query_sql?db=d&q=x", {"X-Iox-Timeout-S": "-1"}),
                           ("/api/v3/query_sql?db=d&q=x", {"X-Iox-Allow-Partial": "yes"})):
            assert _req(conn, "GET", path, headers=hdrs)[0] == 400, path
        conn.close()
    finally:
        srv.stop()


def test_query_sql_binds_params_by_get_and_by_a_json_post_as_influxdb3_takes_them():
    from urllib.parse import quote

    calls = []

    def query(database, sql, after, allow_partial, deadline_s):
        calls.append((database, sql))
        return _Result([{"v": 1}])

    srv = HttpWriteServer(FakeRouter(), "127.0.0.1", free_port())
    srv.queries = SimpleNamespace(query=query)
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        sql = quote("SELECT v FROM m WHERE host = $host AND v > $min")
        params = quote(json.dumps({"host": "it's", "min": -2}))
        assert _req(conn, "GET", f"/api/v3/query_sql?db=d&q={sql}&params={params}")[0] == 200
        assert calls[-1] == ("d", "SELECT v FROM m WHERE host = 'it\\'s' AND v > (-2)")
        body = json.dumps({"db": "d", "q": "SELECT v FROM m WHERE ok = $ok", "format": "jsonl", "params": {"ok": True}})
        status, headers, answer = _req(conn, "POST", "/api/v3/query_sql", body.encode(),
                                       {"Content-Type": "application/json"})
        assert (status, json.loads(answer)) == (200, {"v": 1}) and headers["content-type"].startswith("application/jsonl")
        assert calls[-1] == ("d", "SELECT v FROM m WHERE ok = TRUE")
        n = len(calls)
        for method, path, payload in (
                ("GET", f"/api/v3/query_sql?db=d&q={sql}", None),  # placeholders without params
                ("GET", f"/api/v3/query_sql?db=d&q={sql}&params=%5B1%5D", None),  # params not an object
                ("GET", f"/api/v3/query_sql?db=d&q={sql}&params=" + quote(json.dumps({"host": "a"})), None),
                ("POST", "/api/v3/query_sql", b"not json"),
                ("POST", "/api/v3/query_sql", json.dumps({"db": "d", "q": "SELECT $x", "params": {"x": [1]}}).encode()),
                ("POST", "/api/v3/query_sql", json.dumps({"db": 1, "q": "SELECT 1"}).encode())):
            status, _, answer = _req(conn, method, path, payload)
            assert status == 400, (path, payload, answer)
        assert len(calls) == n  # none of them ran
        conn.close()
    finally:
        srv.stop()


def test_a_query_streams_json_jsonl_csv_or_parquet_batch_by_batch_and_an_error_after_the_first_rows_cuts_it_off():
    from iox_spark.server.errors import InvalidArgument, QueryResultTooLarge

    rows = [{"host": f"h{i}", "v": i / 2, "ok": i % 2 == 0, "n": None if i % 3 == 0 else i, "tags": {"i": i, "s": "x"}}
            for i in range(2500)]
    results = []

    def query(database, sql, after, allow_partial, deadline_s):
        if sql == "refused":
            r = _Result(rows, fail_after=0, fail=InvalidArgument("query failed: no such column"))
        elif sql == "grows":
            r = _Result(rows, per_batch=1000, fail_after=2, fail=QueryResultTooLarge("bytes", 5, "--max-query-bytes"))
        else:
            r = _Result(rows if sql != "empty" else [], per_batch=1000)
            if sql == "empty":
                import pyarrow as pa

                r.schema = pa.schema([("host", pa.string()), ("v", pa.float64())])
        results.append(r)
        return r

    srv = HttpWriteServer(FakeRouter(), "127.0.0.1", free_port())
    srv.queries = SimpleNamespace(query=query)
    srv.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        expect = rows
        for fmt in ("", "&format=json", "&format=JSON"):
            st, h, body = _req(conn, "GET", f"/api/v3/query_sql?db=d&q=all{fmt}")
            assert (st, h["transfer-encoding"], h["content-type"]) == (200, "chunked", "application/json; charset=utf-8")
            assert json.loads(body) == expect and results[-1].closed
        st, h, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=all&format=jsonl")
        assert (st, h["content-type"]) == (200, "application/jsonl; charset=utf-8")
        assert [json.loads(line) for line in body.decode().splitlines()] == expect and body.endswith(b"\n")
        st, h, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=all&format=csv")
        assert (st, h["content-type"]) == (200, "text/csv; charset=utf-8")
        lines = list(csv.reader(io.StringIO(body.decode(), newline="")))
        assert lines[0] == ["host", "v", "ok", "n", "tags"] and len(lines) == 2501
        assert lines[1] == ["h0", "0.0", "true", "", '{"i": 0, "s": "x"}'] and lines[2] == ["h1", "0.5", "false", "1", '{"i": 1, "s": "x"}']
        assert [ln[0] for ln in lines[1:]] == [f"h{i}" for i in range(2500)]
        st, h, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=all&format=parquet")
        assert (st, h["content-type"]) == (200, "application/vnd.apache.parquet")
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(io.BytesIO(body))
        assert pf.metadata.num_row_groups == 3  # a row group per batch, sent as each came
        assert pf.read().to_pylist() == expect
        st, h, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=all&format=pretty")
        assert (st, h["content-type"]) == (200, "text/plain; charset=utf-8")
        text = body.decode().splitlines()
        assert text[0] == text[2] == text[-1] and set(text[0]) == {"+", "-"}
        assert [c.strip() for c in text[1].split("|")[1:-1]] == ["host", "v", "ok", "n", "tags"]
        assert [c.strip() for c in text[3].split("|")[1:-1]] == ["h0", "0.0", "true", "", '{"i": 0, "s": "x"}']
        widest_tags = len('{"i": 2499, "s": "x"}')
        assert {len(ln) for ln in text} == {1 + (5 + 2 + 1) + (6 + 2 + 1) + (5 + 2 + 1) + (4 + 2 + 1) + (widest_tags + 2 + 1)}
        assert len(text) == 2500 + 4
        assert _req(conn, "GET", "/api/v3/query_sql?db=d&q=empty&format=pretty")[::2] == \
            (200, b"+------+---+\n| host | v |\n+------+---+\n+------+---+\n")
        assert pq.read_table(io.BytesIO(_req(conn, "GET", "/api/v3/query_sql?db=d&q=empty&format=parquet")[2])) \
            .num_rows == 0
        assert _req(conn, "GET", "/api/v3/query_sql?db=d&q=empty")[::2] == (200, b"[]")
        assert _req(conn, "GET", "/api/v3/query_sql?db=d&q=empty&format=csv")[::2] == (200, b"host,v\r\n")
        assert _req(conn, "GET", "/api/v3/query_sql?db=d&q=empty&format=jsonl")[::2] == (200, b"")
        # refused before the first batch: a status the user can act on
        st, _, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=refused")
        assert st == 400 and b"no such column" in body
        st, _, body = _req(conn, "GET", "/api/v3/query_sql?db=d&q=all&format=xml")
        assert st == 400 and b"format must be one of json, jsonl, csv" in body
        # the keep-alive connection still serves after those
        assert _req(conn, "GET", "/api/v3/query_sql?db=d&q=empty")[0] == 200
        # an error after the first rows: the answer is cut off, never a shorter one that looks whole
        for fmt in ("json", "jsonl", "csv", "parquet"):
            conn.request("GET", f"/api/v3/query_sql?db=d&q=grows&format={fmt}")
            r = conn.getresponse()
            assert r.status == 200
            with pytest.raises(http.client.IncompleteRead):
                r.read()
            assert results[-1].closed
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        conn.close()
    finally:
        srv.stop()
