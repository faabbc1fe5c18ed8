"""Arrow Flight DoGet on the gRPC port with InfluxDB 3's ticket, through InfluxDB 3's own Python client
(influxdb3-python's `query`, pointed at the gRPC port) and pyarrow's Flight client: exact rows in
the query's schema, a read of the writes acknowledged before it (the query's own read barrier),
answers of many batches, and errors with the status a client acts on."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from influxdb_client_3 import InfluxDBClient3
from influxdb_client_3.exceptions import InfluxDB3ClientQueryError
from tests.timestamps import T0


@pytest.fixture
def v3(iox_server, db):
    c = InfluxDBClient3(host=f"http://127.0.0.1:{iox_server.http.port}", query_port_overwrite=iox_server.grpc_port,
                        database=db, token="unused")
    yield c
    c.close()


def _write(client, db: str, lines: list) -> str:
    return client.write_response(db, "\n".join(lines)).token_text


def test_the_influxdb3_client_queries_with_flight(v3, client, db):
    tok = _write(client, db, [f"cpu,host=a usage=1.5,n=3i {T0}", f"cpu,host=b usage=2.5,n=4i {T0 + 1000}"])
    client.query(db, "SELECT 1 FROM cpu", after=tok)  # both rows visible
    t = v3.query("SELECT host, usage, n, time FROM cpu ORDER BY time")
    assert t.schema == pa.schema([("host", pa.string()), ("usage", pa.float64()), ("n", pa.int64()),
                                  ("time", pa.timestamp("us", tz="UTC"))])
    assert t.column("host").to_pylist() == ["a", "b"] and t.column("usage").to_pylist() == [1.5, 2.5]
    assert t.column("time").cast(pa.int64()).to_pylist() == [T0 // 1000, T0 // 1000 + 1]
    assert v3.query("SELECT sum(n) AS s FROM cpu", mode="pandas")["s"].tolist() == [7]
    assert v3.query("SELECT host FROM cpu WHERE host = 'zzz'").num_rows == 0  # no row: the schema alone


def test_the_influxdb3_client_binds_query_parameters(v3, client, db):
    tok = _write(client, db, [f"cpu,host=a usage=1.5 {T0}", f"cpu,host=it's usage=2.5 {T0 + 1000}"])
    client.query(db, "SELECT 1 FROM cpu", after=tok)
    t = v3.query("SELECT usage FROM cpu WHERE host = $host AND usage > $min",
                 query_parameters={"host": "it's", "min": 2})
    assert t.column("usage").to_pylist() == [2.5]
    assert v3.query("SELECT usage FROM cpu WHERE host = $host", query_parameters={"host": "a' OR 'x'='x"}).num_rows == 0


def test_a_large_answer_comes_in_many_batches(iox_server, client, db):
    n = 150_000
    tok = _write(client, db, [f"big,k=x v={i} {T0 + i}" for i in range(n)])
    client.query(db, "SELECT 1 FROM big LIMIT 1", after=tok)
    with fl.FlightClient(f"grpc+tcp://127.0.0.1:{iox_server.grpc_port}") as f:
        reader = f.do_get(fl.Ticket(json.dumps({"database": db, "sql_query": "SELECT v FROM big ORDER BY v",
                                                "query_type": "sql"}).encode()))
        batches = list(reader)
    assert len(batches) >= 3  # cut at 64,000 rows
    assert [v for b in batches for v in b.data.column(0).to_pylist()] == [float(i) for i in range(n)]


def test_one_port_for_an_influxdb3_client_given_one_address(iox_server, client, db):
    """server/api/one_port.py in front of the server's gRPC and HTTP ports (as --influxdb3-port
    puts it): the client writes over HTTP and queries over Flight through the one address; an
    HTTP/1.1 request on it is answered by the HTTP API."""
    import http.client

    from iox_spark.server.api.one_port import OnePortServer

    one = OnePortServer("127.0.0.1", 0, iox_server.grpc_port, iox_server.http.port).start()
    try:
        with InfluxDBClient3(host=f"http://127.0.0.1:{one.port}", database=db, token="unused",
                             write_use_v2_api=False) as c:
            c.write(record=[f"one,host=a v=1 {T0}", f"one,host=b v=2 {T0 + 1}"])
            rows = []
            from tests.waiting import wait_for

            def both() -> bool:
                try:
                    rows[:] = c.query("SELECT host, v FROM one ORDER BY host").to_pylist()
                except InfluxDB3ClientQueryError:  # the table shows once the server read the write
                    return False
                return len(rows) == 2
            wait_for(both, 60, "the write through the one port")
            assert rows == [{"host": "a", "v": 1.0}, {"host": "b", "v": 2.0}]
        conn = http.client.HTTPConnection("127.0.0.1", one.port, timeout=30)
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["status"] == "pass"
        conn.close()
    finally:
        one.stop()


def test_errors_carry_the_status_a_client_acts_on(iox_server, v3, client, db):
    with pytest.raises(InfluxDB3ClientQueryError, match="not found.*database"):
        v3.query("SELECT 1")
    _write(client, db, [f"cpu v=1 {T0}"])
    with pytest.raises(InfluxDB3ClientQueryError, match="invalid argument.*nope"):
        v3.query("SELECT nope FROM cpu")
    with pytest.raises(InfluxDB3ClientQueryError, match="unimplemented.*query_type 'flux'"):
        v3.query("from(bucket: \"b\")", language="flux")
    with pytest.raises(InfluxDB3ClientQueryError, match="invalid argument.*error parsing query"):
        v3.query("SELEC * FROM cpu", language="influxql")
    with fl.FlightClient(f"grpc+tcp://127.0.0.1:{iox_server.grpc_port}") as f:
        # pyarrow raises INVALID_ARGUMENT as ArrowInvalid, UNIMPLEMENTED as ArrowNotImplementedError
        for ticket, cls, text in ((b"not json", pa.ArrowInvalid, "not InfluxDB 3's JSON"),
                                  (json.dumps({"sql_query": "SELECT 1"}).encode(), pa.ArrowInvalid,
                                   "names no database"),
                                  (json.dumps({"database": db, "sql_query": "SELECT $x", "params": [1]}).encode(),
                                   pa.ArrowInvalid, "params"),
                                  (json.dumps({"database": db, "sql_query": "SELECT $x, $y", "params": {"x": 1}}).encode(),
                                   pa.ArrowInvalid, "no value is given for the parameter \\$y"),
                                  (json.dumps({"database": db, "sql_query": "DROP TABLE cpu"}).encode(),
                                   pa.ArrowInvalid, "not a query")):
            with pytest.raises(cls, match=text):
                f.do_get(fl.Ticket(ticket)).read_all()
