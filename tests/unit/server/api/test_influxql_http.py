"""server/api/http_api.py `_influxql` against a fake query path (no Spark): InfluxQL answers stream
over HTTP. A measurement's last batch is held back until the client has read the first series, so
an answer built whole never comes; the body is exactly the whole document's text; an error after
the first series cuts the answer off, one before it answers as a statement error or a status."""
from __future__ import annotations

import http.client
import json
import threading
from types import SimpleNamespace
from urllib.parse import quote

import pyarrow as pa
import pytest

from iox_spark.server.api.http_api import HttpWriteServer
from iox_spark.server.errors import QueryResultTooLarge
from iox_spark.server.runtime.broker import free_port

S = 1_000_000_000
TABLES = {"cpu": [("host", "tag", "string"), ("usage", "field", "float")]}
SCHEMA = pa.schema([("__t", pa.int64()), ("__g0", pa.string()), ("__c0", pa.float64())])
ROWS = [(S, "a", 1.0), (2 * S, "a", 2.0), (S, "b", 3.0), (2 * S, "b", 4.0)]


class _Result:
    """A QueryResult's surface: ROWS one per batch. Before batch `gate_at`, waits until `gate` is set
    (an answer that reads every batch before it writes never gets there); `fail` = (batch, error)."""

    def __init__(self, gate: threading.Event | None = None, gate_at: int = 3, fail=None):
        self.schema = SCHEMA
        self.gate, self.gate_at, self.fail = gate, gate_at, fail
        self.closed = False

    def batches(self):
        try:
            for i, row in enumerate(ROWS):
                if self.gate is not None and i == self.gate_at and not self.gate.wait(5):
                    raise RuntimeError("the client never saw the first series: the answer did not stream")
                if self.fail is not None and i == self.fail[0]:
                    raise self.fail[1]
                yield pa.RecordBatch.from_pylist([dict(zip(SCHEMA.names, row))], schema=SCHEMA)
        finally:
            self.closed = True

    @property
    def table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches()), schema=SCHEMA)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def served():
    made = []
    queries = SimpleNamespace(results=made, make=_Result, table_columns=lambda db: TABLES, database_names=lambda: ["d"])

    def query(database, sql, after="", allow_partial=False, deadline_s=None):
        r = queries.make()
        made.append(r)
        return r

    queries.query = query
    srv = HttpWriteServer(SimpleNamespace(max_request_bytes=1000), "127.0.0.1", free_port())
    srv.queries = queries
    srv.start()
    yield queries, srv.port
    srv.stop()


def _read_until(r: http.client.HTTPResponse, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        piece = r.read1(65536)
        assert piece, f"the answer ended before {marker!r}: {got!r}"
        got += piece
    return got


_Q = quote("SELECT usage FROM cpu GROUP BY host")
_DOC = {"results": [{"statement_id": 0, "series": [
    {"name": "cpu", "tags": {"host": "a"}, "columns": ["time", "usage"], "values": [[1, 1.0], [2, 2.0]]},
    {"name": "cpu", "tags": {"host": "b"}, "columns": ["time", "usage"], "values": [[1, 3.0], [2, 4.0]]}]}]}


def test_the_1x_answer_sends_its_first_series_before_the_last_batch_is_read(served):
    queries, port = served
    gate = threading.Event()
    queries.make = lambda: _Result(gate)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/query?db=d&epoch=s&q={_Q}")
    r = conn.getresponse()
    assert (r.status, r.getheader("Transfer-Encoding"), r.getheader("Content-Type")) == (200, "chunked",
                                                                                        "application/json")
    head = _read_until(r, b'"values": [[1, 1.0], [2, 2.0]]}')
    assert b'"host": "b"' not in head
    gate.set()
    body = head + r.read()
    assert body == json.dumps(_DOC).encode()  # the text of the whole document, byte for byte
    assert queries.results[0].closed
    # chunked (1.x's chunked=true): one document per line, streamed the same way
    gate.clear()
    conn.request("GET", f"/query?db=d&epoch=s&chunked=true&chunk_size=1&q={_Q}")
    r = conn.getresponse()
    head = _read_until(r, b"\n")
    gate.set()
    lines = (head + r.read()).splitlines()
    assert [json.loads(line)["results"][0]["series"][0]["values"] for line in lines] == [[[1, 1.0]], [[2, 2.0]],
                                                                                        [[1, 3.0]], [[2, 4.0]]]
    assert [json.loads(line)["results"][0].get("partial") for line in lines] == [True, True, True, None]
    conn.close()


def test_the_influxdb3_answer_sends_its_first_series_before_the_last_batch_is_read(served, monkeypatch):
    from iox_spark.server.api import influxql_answer

    queries, port = served
    gate = threading.Event()
    # small series are gathered into batches of this many rows: series a (2 rows) is one of its own
    monkeypatch.setattr(influxql_answer, "_V3_BATCH_ROWS", 2, raising=False)
    queries.make = lambda: _Result(gate)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/api/v3/query_influxql?db=d&format=csv&q={_Q}")
    r = conn.getresponse()
    assert (r.status, r.getheader("Content-Type")) == (200, "text/csv; charset=utf-8")
    head = _read_until(r, b"2.0\r\n")
    gate.set()
    assert (head + r.read()).decode().splitlines() == [
        "iox::measurement,time,host,usage",
        "cpu,1970-01-01 00:00:01+00:00,a,1.0", "cpu,1970-01-01 00:00:02+00:00,a,2.0",
        "cpu,1970-01-01 00:00:01+00:00,b,3.0", "cpu,1970-01-01 00:00:02+00:00,b,4.0"]
    conn.close()


def test_an_error_after_the_first_series_cuts_the_answer_off_one_before_it_is_the_statements(served):
    queries, port = served
    too_large = QueryResultTooLarge("bytes", 5, "--max-query-bytes")
    for path in (f"/query?db=d&q={_Q}", f"/query?db=d&chunked=true&q={_Q}",
                 f"/api/v3/query_influxql?db=d&format=json&q={_Q}"):
        queries.make = lambda: _Result(fail=(3, too_large))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", path)
        r = conn.getresponse()
        assert r.status == 200
        with pytest.raises(http.client.IncompleteRead):
            r.read()
        assert queries.results[-1].closed
        conn.close()
    queries.make = lambda: _Result(fail=(1, too_large))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/query?db=d&q={_Q}" + quote("; SHOW DATABASES"))
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (200, {"results": [
        {"statement_id": 0, "error": str(too_large)},
        {"statement_id": 1, "series": [{"name": "databases", "columns": ["name"], "values": [["d"]]}]}]})
    conn.request("GET", f"/api/v3/query_influxql?db=d&q={_Q}")
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (400, {"error": str(too_large)})
    conn.close()
