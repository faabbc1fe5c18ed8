"""`POST /api/v3/write_lp`, with InfluxDB 3's own Python client (influxdb3-python, writing through
the v3 endpoint) and with raw HTTP for what that client does not send (precision=auto): every
line written, or the lines that could not be written named in InfluxDB 3's shapes while the others
are written (accept_partial, the default), or nothing written (accept_partial=false); no_sync
answers before Kafka acknowledged the write, which is then read like any other."""
from __future__ import annotations

import http.client
import json

import pytest
from influxdb_client_3 import InfluxDBClient3
from influxdb_client_3.exceptions import InfluxDBError
from tests.rows import query_rows

T0 = 1_700_000_000  # seconds


@pytest.fixture
def v3(iox_server, db):
    def make(**kw):
        return InfluxDBClient3(host=f"http://127.0.0.1:{iox_server.http.port}", database=db, token="unused",
                               write_use_v2_api=False, **kw)
    return make


def _post(iox_server, path: str, body: bytes) -> tuple[int, dict | None, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", iox_server.http.port, timeout=60)
    try:
        conn.request("POST", path, body=body)
        r = conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data else None), dict(r.getheaders())
    finally:
        conn.close()


def _rows_once(client, db: str, sql: str, n: int) -> list:
    """The rows of `sql` once it answers `n` rows (a write without a token shows when the server
    read it: waited for, then the answer is checked whole)."""
    from tests.waiting import wait_for

    got: list = []

    def enough() -> bool:
        try:
            got[:] = query_rows(client, db, sql)
        except Exception:  # noqa: BLE001 - the table is not known before its first write shows
            return False
        return len(got) >= n
    wait_for(enough, 60, f"{n} rows of {sql!r}")
    return got


def test_the_influxdb3_client_writes_through_write_lp(v3, client, db):
    with v3() as c:
        c.write(record=[f"cpu,host=a usage=1.5 {T0}000000000", f"cpu,host=b usage=2.5 {T0 + 1}000000000"])
    rows = _rows_once(client, db, "SELECT host, usage, time_ns FROM cpu ORDER BY time_ns", 2)
    assert rows == [{"host": "a", "usage": 1.5, "time_ns": T0 * 10**9},
                    {"host": "b", "usage": 2.5, "time_ns": (T0 + 1) * 10**9}]


def test_a_partial_write_writes_the_good_lines_and_names_the_others(v3, client, db):
    with v3() as c:
        c.write(record=f"home,room=Sunroom temp=96 {T0}000000000")
        with pytest.raises(InfluxDBError) as e:
            c.write(record="\n".join([f"home,room=Sunroom temp=\"hi\" {T0 + 1}000000000",  # the table's temp: float
                                      f"home,room=Kitchen temp=21 {T0}000000000",
                                      "home,room=Attic",  # no field
                                      f"home,room=Attic temp=15 {T0 + 2}000000000",
                                      f"home,room=Attic temp=16i {T0 + 3}000000000"]))  # not as line 2's
    err = e.value
    assert err.response.status == 400
    assert [(x.line_number, x.original_line) for x in err.line_errors] == \
        [(1, f'home,room=Sunroom temp="hi" {T0 + 1}000000000'), (3, "home,room=Attic"),
         (5, f"home,room=Attic temp=16i {T0 + 3}000000000")]
    assert err.line_errors[0].error_message == ("invalid column type for column 'temp', expected "
                                                "iox::column_type::field::float, got iox::column_type::field::string")
    assert "temp" in err.line_errors[2].error_message and "integer" in err.line_errors[2].error_message
    assert _rows_once(client, db, "SELECT room, temp FROM home ORDER BY time_ns, room", 3) == [
        {"room": "Kitchen", "temp": 21.0}, {"room": "Sunroom", "temp": 96.0}, {"room": "Attic", "temp": 15.0}]


def test_without_accept_partial_nothing_is_written(iox_server, v3, client, db):
    with v3() as c:
        c.write(record=f"m v=1 {T0}000000000")
    status, body, _h = _post(iox_server, f"/api/v3/write_lp?db={db}&accept_partial=false",
                             f"m v=2 {T0 + 1}000000000\nm v=oops {T0 + 2}000000000\n".encode())
    assert status == 400 and body["error"] == "parsing failed for write_lp endpoint"
    assert (body["data"]["line_number"], body["data"]["original_line"]) == (2, f"m v=oops {T0 + 2}000000000")
    status, body, _h = _post(iox_server, f"/api/v3/write_lp?db={db}&accept_partial=false",
                             f"m v=\"s\" {T0 + 3}000000000\nm v=3 {T0 + 4}000000000\n".encode())
    assert status == 400 and body["data"]["line_number"] == 1 and "expected iox::column_type::field::float" in \
        body["data"]["error_message"]
    with v3(write_accept_partial=False) as c, pytest.raises(InfluxDBError) as e:
        c.write(record=f"m v=4 {T0 + 5}000000000\nm v=bad {T0 + 6}000000000")
    assert e.value.response.status == 400 and "parsing failed for write_lp endpoint" in e.value.message
    status, _b, headers = _post(iox_server, f"/api/v3/write_lp?db={db}", f"m v=9 {T0 + 9}000000000".encode())
    assert status == 204  # written after the refused ones, to the same table: shown after them
    assert query_rows(client, db, "SELECT v FROM m ORDER BY v", headers["X-Iox-Write-Token"]) == [{"v": 1.0}, {"v": 9.0}]


def test_precision_auto_reads_each_timestamps_unit(iox_server, client, db):
    body = "\n".join([f"p,u=s v=1 {T0}", f"p,u=ms v=2 {T0}123", f"p,u=us v=3 {T0}123456",
                      f"p,u=ns v=4 {T0}123456789"]).encode()
    status, _b, headers = _post(iox_server, f"/api/v3/write_lp?db={db}", body)  # precision: auto by default
    assert status == 204 and headers.get("X-Iox-Write-Token")
    rows = query_rows(client, db, "SELECT u, time_ns FROM p ORDER BY u", headers["X-Iox-Write-Token"])
    assert {r["u"]: r["time_ns"] for r in rows} == {"s": T0 * 10**9, "ms": T0 * 10**9 + 123_000_000,
                                                    "us": T0 * 10**9 + 123_456_000, "ns": T0 * 10**9 + 123_456_789}
    status, _b, headers = _post(iox_server, f"/api/v3/write_lp?db={db}&precision=second", f"q v=1 {T0}".encode())
    assert status == 204
    assert query_rows(client, db, "SELECT time_ns FROM q", headers["X-Iox-Write-Token"]) == [{"time_ns": T0 * 10**9}]
    status, body, _h = _post(iox_server, f"/api/v3/write_lp?db={db}&precision=fortnight", b"q v=1 1")
    assert status == 400 and "precision must be one of auto" in body["error"]
    status, body, _h = _post(iox_server, "/api/v3/write_lp", b"q v=1 1")
    assert status == 400 and "db query parameter" in body["error"]


def test_no_sync_answers_before_the_acknowledgement_and_the_write_is_read(iox_server, v3, client, db):
    with v3(write_no_sync=True) as c:
        c.write(record=[f"ns,host=h v={i} {T0 + i}000000000" for i in range(5)])
    status, _b, headers = _post(iox_server, f"/api/v3/write_lp?db={db}&no_sync=true", f"ns v=5 {T0 + 5}".encode())
    assert status == 204 and "X-Iox-Write-Token" not in headers  # not acknowledged yet: no token to give
    assert sorted(r["v"] for r in _rows_once(client, db, "SELECT v FROM ns", 6)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_query_sql_answers_parquet_pretty_and_binds_params_as_influxdb3_does(iox_server, client, db):
    """`/api/v3/query_sql` of the running server: format=parquet (a Parquet file of the exact rows),
    format=pretty (an ASCII table), params by GET, and POST of InfluxDB 3's JSON body."""
    import io
    from urllib.parse import quote

    import pyarrow.parquet as pq

    tok = client.write_response(db, f"cpu,host=a usage=1.5 {T0 * 10**9}\ncpu,host=b usage=2.5 {T0 * 10**9 + 1}") \
        .token_text
    client.query(db, "SELECT 1 FROM cpu", after=tok)

    def get(path):
        conn = http.client.HTTPConnection("127.0.0.1", iox_server.http.port, timeout=60)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    sql = quote("SELECT host, usage FROM cpu ORDER BY host")
    status, body = get(f"/api/v3/query_sql?db={db}&q={sql}&format=parquet")
    assert status == 200
    assert pq.read_table(io.BytesIO(body)).to_pylist() == [{"host": "a", "usage": 1.5}, {"host": "b", "usage": 2.5}]
    status, body = get(f"/api/v3/query_sql?db={db}&q={sql}&format=pretty")
    assert (status, body.decode()) == (200, "+------+-------+\n| host | usage |\n+------+-------+\n"
                                            "| a    | 1.5   |\n| b    | 2.5   |\n+------+-------+\n")
    where = quote("SELECT usage FROM cpu WHERE host = $host")
    status, body = get(f"/api/v3/query_sql?db={db}&q={where}&params=" + quote(json.dumps({"host": "b"})))
    assert (status, json.loads(body)) == (200, [{"usage": 2.5}])
    conn = http.client.HTTPConnection("127.0.0.1", iox_server.http.port, timeout=60)
    try:
        conn.request("POST", "/api/v3/query_sql", body=json.dumps(
            {"db": db, "q": "SELECT host FROM cpu WHERE usage > $min", "format": "jsonl", "params": {"min": 2}}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert (r.status, r.read()) == (200, b'{"host": "b"}\n')
    finally:
        conn.close()
