"""InfluxQL through the clients users have: the `influxdb` 1.x Python client on `/query` (1.x JSON,
epoch, chunked), influxdb3-python over Flight (query_type influxql) and `/api/v3/query_influxql`:
exact series for the queries Grafana's InfluxQL editor writes (GROUP BY time and tags, fill, time
filters as `$timeFilter` expands them), selectors, transformations, SHOW statements, and errors in
1.x's shape; whole answers byte for byte as they stream (series of several measurements in
InfluxDB's order, fill, ORDER BY time DESC with LIMIT per series, SLIMIT/SOFFSET, chunks, InfluxDB
3's table)."""
from __future__ import annotations

import http.client
import json
from urllib.parse import quote

import pytest
from influxdb import InfluxDBClient
from influxdb.exceptions import InfluxDBClientError
from influxdb_client_3 import InfluxDBClient3

from tests.timestamps import S, T0

T0_TEXT = "2023-11-14T22:13:20Z"


@pytest.fixture
def data(iox_server, client, db):
    """cpu: host a every 10 s from T0 (usage 1..6), host b at T0 and T0+30 s (usage 10, 40), one point
    without a host; mem: one point."""
    lines = [f"cpu,host=a,region=eu usage={i + 1}.0,n={i}i {T0 + i * 10 * S}" for i in range(6)]
    lines += [f"cpu,host=b,region=us usage=10.0,n=100i {T0}", f"cpu,host=b,region=us usage=40.0,n=103i {T0 + 30 * S}",
              f"cpu usage=7.0 {T0 + 5 * S}", f"mem,host=a free=5i {T0}"]
    token = client.write_response(db, "\n".join(lines)).token_text
    client.query(db, "SELECT 1 FROM cpu", after=token)
    client.query(db, "SELECT 1 FROM mem", after=token)
    return db


@pytest.fixture
def v1(iox_server, data):
    c = InfluxDBClient(host="127.0.0.1", port=iox_server.http.port, database=data)
    yield c
    c.close()


def _series(rs) -> list:
    return rs.raw.get("series", [])


def test_grafanas_mean_by_time_and_host_with_fill_null(v1):
    rs = v1.query(f'SELECT mean("usage") FROM "cpu" WHERE time >= {T0 // 10**6}ms and time <= {(T0 + 59 * S) // 10**6}ms '
                  f'GROUP BY time(20s), "host" fill(null)', epoch="s")
    series = _series(rs)
    assert [s["tags"] for s in series] == [{"host": ""}, {"host": "a"}, {"host": "b"}]
    t = T0 // S
    assert series[1] == {"name": "cpu", "tags": {"host": "a"}, "columns": ["time", "mean"],
                         "values": [[t, 1.5], [t + 20, 3.5], [t + 40, 5.5]]}
    assert series[2]["values"] == [[t, 10.0], [t + 20, 40.0], [t + 40, None]]
    assert series[0]["values"] == [[t, 7.0], [t + 20, None], [t + 40, None]]


@pytest.mark.parametrize("fill,expect", [
    ("none", [[0, 10.0], [30, 40.0]]),
    ("0", [[0, 10.0], [10, 0], [20, 0], [30, 40.0]]),
    ("previous", [[0, 10.0], [10, 10.0], [20, 10.0], [30, 40.0]]),
    ("linear", [[0, 10.0], [10, 20.0], [20, 30.0], [30, 40.0]]),
])
def test_fill(v1, fill, expect):
    rs = v1.query(f"SELECT max(usage) FROM cpu WHERE host = 'b' AND time >= '{T0_TEXT}' AND time < '{T0_TEXT}' + 40s "
                  f"GROUP BY time(10s) fill({fill})", epoch="s")
    assert _series(rs)[0]["values"] == [[T0 // S + dt, v] for dt, v in expect]


def test_aggregates_and_selectors_without_group_by_time(v1):
    rs = v1.query("SELECT count(usage), sum(n), min(usage), spread(usage), median(usage), percentile(usage, 50), "
                  "first(usage), last(usage) FROM cpu WHERE host = 'a'", epoch="s")
    s = _series(rs)[0]
    assert s["columns"] == ["time", "count", "sum", "min", "spread", "median", "percentile", "first", "last"]
    assert s["values"] == [[0, 6, 15, 1.0, 5.0, 3.5, 3.0, 1.0, 6.0]]
    # a lone selector answers the time of its point
    assert _series(v1.query("SELECT max(usage) FROM cpu", epoch="s"))[0]["values"] == [[T0 // S + 30, 40.0]]
    assert _series(v1.query("SELECT last(usage) FROM cpu WHERE host = 'a'", epoch="s"))[0]["values"] == \
        [[T0 // S + 50, 6.0]]


def test_raw_points_tags_regexes_order_and_limits(v1):
    rs = v1.query("SELECT usage, host FROM cpu WHERE host =~ /^(a|b)$/ AND usage > 3 ORDER BY time DESC LIMIT 3",
                  epoch="s")
    t = T0 // S
    assert _series(rs) == [{"name": "cpu", "columns": ["time", "usage", "host"],
                            "values": [[t + 50, 6.0, "a"], [t + 40, 5.0, "a"], [t + 30, 40.0, "b"]]}]
    # a missing tag compares as ''; != matches it too
    assert _series(v1.query("SELECT usage FROM cpu WHERE host = ''", epoch="s"))[0]["values"] == [[t + 5, 7.0]]
    assert [v[1] for v in _series(v1.query("SELECT usage FROM cpu WHERE host != 'a'"))[0]["values"]] == [10.0, 7.0, 40.0]
    # RFC 3339 times without epoch; SLIMIT over the series of GROUP BY tags
    rs = v1.query("SELECT usage FROM cpu WHERE region !~ /eu/ GROUP BY host SLIMIT 1 SOFFSET 1")
    assert _series(rs) == [{"name": "cpu", "tags": {"host": "b"}, "columns": ["time", "usage"],
                            "values": [[T0_TEXT, 10.0], ["2023-11-14T22:13:50Z", 40.0]]}]
    assert len(list(v1.query("SELECT * FROM cpu").get_points())) == 9
    assert list(v1.query("SELECT * FROM cpu WHERE host = 'b' LIMIT 1").get_points()) == \
        [{"time": T0_TEXT, "host": "b", "n": 100, "region": "us", "usage": 10.0}]


def test_transformations(v1):
    rs = v1.query(f"SELECT derivative(mean(usage), 1s), difference(max(usage)), moving_average(max(usage), 2) "
                  f"FROM cpu WHERE host = 'a' AND time >= {T0} AND time < {T0 + 40 * S} GROUP BY time(20s)", epoch="s")
    t = T0 // S
    assert _series(rs)[0]["values"] == [[t + 20, 0.1, 2.0, 3.0]]
    rs = v1.query("SELECT non_negative_derivative(usage, 10s) FROM cpu WHERE host = 'b'", epoch="s")
    assert _series(rs)[0]["values"] == [[t + 30, 10.0]]


def test_subqueries(v1):
    t = T0 // S
    rs = v1.query("SELECT max(mean) FROM (SELECT mean(usage) FROM cpu GROUP BY time(20s), host) GROUP BY host",
                  epoch="s")
    assert [(s["tags"], s["values"]) for s in _series(rs)] == [
        ({"host": ""}, [[t, 7.0]]), ({"host": "a"}, [[t + 40, 5.5]]), ({"host": "b"}, [[t + 20, 40.0]])]  # max: its point's time
    rs = v1.query("SELECT mean(m) FROM (SELECT max(usage) AS m FROM cpu GROUP BY host)", epoch="s")
    assert _series(rs)[0]["values"] == [[0, pytest.approx((6.0 + 40.0 + 7.0) / 3)]]
    rs = v1.query("SELECT m FROM (SELECT max(usage) AS m FROM cpu GROUP BY time(30s), host) WHERE host = 'b'",
                  epoch="s")
    assert _series(rs)[0]["values"] == [[t - 20, 10.0], [t + 10, 40.0]]
    # transformations inside: the rate of each host's counter, summed across hosts
    rs = v1.query(f"SELECT sum(rate) FROM (SELECT non_negative_derivative(max(n), 1s) AS rate FROM cpu "
                  f"WHERE time >= {T0} AND time < {T0 + 60 * S} GROUP BY time(10s), host) "
                  f"WHERE time >= {T0 - 20 * S} AND time < {T0 + 60 * S} GROUP BY time(30s)", epoch="s")
    # host a: n = 0..5 every 10 s, a rate of 0.1/s at T0+10 .. T0+50; host b: 100 at T0, 103 at T0+30 (0.1/s
    # at T0+30); 30 s buckets from T0-20 (T0 is 20 s into one)
    assert _series(rs)[0]["values"] == [[t - 20, None], [t + 10, pytest.approx(0.4)], [t + 40, pytest.approx(0.2)]]
    rs = v1.query("SELECT c FROM (SELECT cumulative_sum(usage) AS c, moving_average(usage, 2) AS m FROM cpu "
                  "WHERE host = 'a')", epoch="s")
    assert [v[1] for v in _series(rs)[0]["values"]] == [1.0, 3.0, 6.0, 10.0, 15.0, 21.0]


def test_bound_parameters(iox_server, v1, data):
    """1.x's `params` (the client's bind_params) and InfluxDB 3's (query_parameters) fill `$name`
    placeholders with literals: a value never reads as InfluxQL."""
    rs = v1.query("SELECT usage FROM cpu WHERE host = $host AND usage > $min", bind_params={"host": "b", "min": 20},
                  epoch="s")
    assert _series(rs)[0]["values"] == [[T0 // S + 30, 40.0]]
    assert _series(v1.query("SELECT usage FROM cpu WHERE host = $host", bind_params={"host": "b' OR host = 'a"})) == []
    c = InfluxDBClient3(host=f"http://127.0.0.1:{iox_server.http.port}", query_port_overwrite=iox_server.grpc_port,
                        database=data, token="unused")
    try:
        t = c.query("SELECT max(usage) FROM cpu WHERE region = $r", language="influxql", query_parameters={"r": "eu"})
    finally:
        c.close()
    assert t.column("max").to_pylist() == [6.0]


def test_show_statements(v1, data):
    assert data in [d["name"] for d in v1.get_list_database()]
    assert [m["name"] for m in v1.get_list_measurements()] == ["cpu", "mem"]
    assert _series(v1.query("SHOW MEASUREMENTS WITH MEASUREMENT =~ /^c/"))[0]["values"] == [["cpu"]]
    assert _series(v1.query("SHOW TAG KEYS FROM cpu")) == [{"name": "cpu", "columns": ["tagKey"],
                                                            "values": [["host"], ["region"]]}]
    assert _series(v1.query('SHOW TAG VALUES FROM cpu WITH KEY = "host"'))[0]["values"] == [["host", "a"], ["host", "b"]]
    assert _series(v1.query("SHOW TAG VALUES WITH KEY IN (host, region) WHERE region = 'us'")) == [
        {"name": "cpu", "columns": ["key", "value"], "values": [["host", "b"], ["region", "us"]]}]
    assert _series(v1.query("SHOW FIELD KEYS")) == [
        {"name": "cpu", "columns": ["fieldKey", "fieldType"], "values": [["n", "integer"], ["usage", "float"]]},
        {"name": "mem", "columns": ["fieldKey", "fieldType"], "values": [["free", "integer"]]}]
    assert v1.get_list_retention_policies(data)[0]["name"] == "autogen"


def test_several_statements_errors_and_chunks(iox_server, v1, data):
    rs = v1.query("SELECT count(usage) FROM cpu; SELECT count(free) FROM mem", epoch="s")
    assert [r.raw["series"][0]["values"] for r in rs] == [[[0, 9]], [[0, 1]]]
    # a statement that fails has its error; the others still answer (the 1.x client raises on any)
    conn = http.client.HTTPConnection("127.0.0.1", iox_server.http.port, timeout=60)
    conn.request("GET", f"/query?db={data}&epoch=s&q=" + quote("SELECT count(usage) FROM cpu; SELECT nope(usage) FROM cpu"))
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (200, {"results": [
        {"statement_id": 0, "series": [{"name": "cpu", "columns": ["time", "count"], "values": [[0, 9]]}]},
        {"statement_id": 1, "error": "undefined function nope()"}]})
    conn.request("GET", f"/query?db={data}&q=" + quote("SELEC 1"))
    r = conn.getresponse()
    assert r.status == 400 and json.loads(r.read())["error"].startswith("error parsing query: found SELEC")
    conn.close()
    with pytest.raises(InfluxDBClientError, match="error parsing query"):
        v1.query("SELEC usage FROM cpu")
    pieces = list(v1.query("SELECT usage FROM cpu WHERE host = 'a'", chunked=True, chunk_size=4, epoch="s"))
    assert [[p["usage"] for p in rs.get_points()] for rs in pieces] == [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0]]


def test_influxdb3_clients_query_influxql_over_flight_and_http(iox_server, data):
    c = InfluxDBClient3(host=f"http://127.0.0.1:{iox_server.http.port}", query_port_overwrite=iox_server.grpc_port,
                        database=data, token="unused")
    try:
        t = c.query("SELECT mean(usage) FROM cpu WHERE host = 'a' GROUP BY time(30s) fill(none)", language="influxql")
    finally:
        c.close()
    assert t.column_names == ["iox::measurement", "time", "mean"]
    # buckets aligned to the epoch: T0 is 20 s into one of 30 s
    assert t.column("mean").to_pylist() == [1.0, 3.0, 5.5]
    assert t.column("time").cast("int64").to_pylist() == [T0 - 20 * S, T0 + 10 * S, T0 + 40 * S]
    conn = http.client.HTTPConnection("127.0.0.1", iox_server.http.port, timeout=60)
    conn.request("GET", f"/api/v3/query_influxql?db={data}&format=jsonl&q=" +
                 quote("SELECT max(usage) FROM cpu GROUP BY host"))
    r = conn.getresponse()
    rows = [json.loads(line) for line in r.read().decode().splitlines()]
    conn.close()
    assert r.status == 200
    assert [(row["host"], row["max"]) for row in rows] == [("", 7.0), ("a", 6.0), ("b", 40.0)]


#: Grafana's InfluxQL editor's queries, with its macros expanded as it sends them ($timeFilter as
#: `time >= <ms>ms and time <= <ms>ms`, $__interval as a duration), each with the answer it must get
#: (series name, tags, values; times in ms as Grafana asks with epoch=ms)
_FROM_MS, _TO_MS = T0 // 10**6, (T0 + 59 * S) // 10**6
_TIME_FILTER = f"time >= {_FROM_MS}ms and time <= {_TO_MS}ms"
_GRAFANA = [
    (f'SELECT mean("usage") FROM "cpu" WHERE ("host" =~ /^a$/) AND {_TIME_FILTER} GROUP BY time(30s) fill(null)',
     [("cpu", None, [[_FROM_MS - 20_000, 1.0], [_FROM_MS + 10_000, 3.0], [_FROM_MS + 40_000, 5.5]])]),
    (f'SELECT mean("usage") AS "avg" FROM "autogen"."cpu" WHERE {_TIME_FILTER} GROUP BY time(1m), "host" fill(none)',
     [("cpu", {"host": ""}, [[_FROM_MS - 20_000, 7.0]]),
      ("cpu", {"host": "a"}, [[_FROM_MS - 20_000, 2.5], [_FROM_MS + 40_000, 5.5]]),
      ("cpu", {"host": "b"}, [[_FROM_MS - 20_000, 25.0]])]),
    (f'SELECT last("usage") FROM "cpu" WHERE ("region" = \'us\') AND {_TIME_FILTER} GROUP BY time(20s) fill(previous)',
     [("cpu", None, [[_FROM_MS, 10.0], [_FROM_MS + 20_000, 40.0], [_FROM_MS + 40_000, 40.0]])]),
    (f'SELECT non_negative_derivative(mean("n"), 1s) FROM "cpu" WHERE "host" = \'a\' AND {_TIME_FILTER} '
     f'GROUP BY time(20s) fill(null)',
     [("cpu", None, [[_FROM_MS + 20_000, 0.1], [_FROM_MS + 40_000, 0.1]])]),
    (f'SELECT percentile("usage", 95) FROM "cpu" WHERE {_TIME_FILTER} GROUP BY "region"',
     [("cpu", {"region": ""}, [[_FROM_MS, 7.0]]), ("cpu", {"region": "eu"}, [[_FROM_MS, 6.0]]),
      ("cpu", {"region": "us"}, [[_FROM_MS, 40.0]])]),
    (f'SELECT count("usage") FROM "cpu" WHERE {_TIME_FILTER} GROUP BY time(1m) tz(\'Europe/Berlin\')',
     [("cpu", None, [[_FROM_MS - 20_000, 7], [_FROM_MS + 40_000, 2]])]),
    ('SELECT "usage" FROM "cpu" WHERE time >= now() - 100000d and time <= now() AND "host" = \'b\'',
     [("cpu", None, [[_FROM_MS, 10.0], [_FROM_MS + 30_000, 40.0]])]),
    ("SHOW MEASUREMENTS WITH MEASUREMENT =~ /(?i)CP/ LIMIT 100", [("measurements", None, [["cpu"]])]),
    ('SHOW TAG KEYS FROM "cpu"', [("cpu", None, [["host"], ["region"]])]),
    ('SHOW FIELD KEYS FROM "cpu"', [("cpu", None, [["n", "integer"], ["usage", "float"]])]),
    ('SHOW TAG VALUES FROM "cpu" WITH KEY = "host" WHERE "region" = \'eu\'', [("cpu", None, [["host", "a"]])]),
]


@pytest.mark.parametrize("query,expect", _GRAFANA, ids=[q[:48] for q, _ in _GRAFANA])
def test_the_queries_grafanas_influxql_editor_sends(iox_server, data, query, expect):
    conn = http.client.HTTPConnection("127.0.0.1", iox_server.http.port, timeout=60)
    try:
        conn.request("GET", f"/query?db={data}&epoch=ms&q=" + quote(query))
        r = conn.getresponse()
        doc = json.loads(r.read())
    finally:
        conn.close()
    assert r.status == 200
    [result] = doc["results"]
    assert "error" not in result, result
    assert [(s.get("name"), s.get("tags"), s["values"]) for s in result.get("series", [])] == expect


def test_tz_aligns_days_and_writes_times_in_the_zone(v1):
    rs = v1.query("SELECT count(usage) FROM cpu WHERE time >= '2023-11-13T00:00:00Z' AND time < '2023-11-16T00:00:00Z' "
                  "GROUP BY time(1d) fill(none) tz('Europe/Berlin')")
    assert _series(rs)[0]["values"] == [["2023-11-14T00:00:00+01:00", 9]]  # 22:13Z is 23:13 in Berlin
    rs = v1.query("SELECT count(usage) FROM cpu WHERE time >= '2023-11-13T00:00:00Z' AND time < '2023-11-16T00:00:00Z' "
                  "GROUP BY time(1d) fill(none)")
    assert _series(rs)[0]["values"] == [["2023-11-14T00:00:00Z", 9]]


def _get(port: int, path: str) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_whole_1x_answers_byte_for_byte_series_in_measurement_then_tag_order(iox_server, data):
    port, t = iox_server.http.port, T0 // S
    # FROM lists mem first: the series come by measurement name, then by tag value ('' first)
    q = "SELECT count(usage), count(free) FROM mem, cpu GROUP BY host; SELECT usage FROM cpu WHERE host = 'none'"
    status, headers, body = _get(port, f"/query?db={data}&epoch=s&q={quote(q)}")
    assert (status, headers["transfer-encoding"], headers["content-type"]) == (200, "chunked", "application/json")
    columns = ["time", "count", "count_1"]
    assert body == json.dumps({"results": [{"statement_id": 0, "series": [
        {"name": "cpu", "tags": {"host": ""}, "columns": columns, "values": [[0, 1, 0]]},
        {"name": "cpu", "tags": {"host": "a"}, "columns": columns, "values": [[0, 6, 0]]},
        {"name": "cpu", "tags": {"host": "b"}, "columns": columns, "values": [[0, 2, 0]]},
        {"name": "mem", "tags": {"host": "a"}, "columns": columns, "values": [[0, 0, 1]]}]},
        {"statement_id": 1}]}).encode()
    # GROUP BY time with fill, then ORDER BY time DESC and LIMIT in each series
    q = (f"SELECT max(usage) FROM cpu WHERE time >= {T0} AND time < {T0 + 40 * S} GROUP BY time(10s), host fill(0) "
         f"ORDER BY time DESC LIMIT 3")
    series = [{"name": "cpu", "tags": {"host": h}, "columns": ["time", "max"], "values": values} for h, values in (
        ("", [[t + 30, 0], [t + 20, 0], [t + 10, 0]]), ("a", [[t + 30, 4.0], [t + 20, 3.0], [t + 10, 2.0]]),
        ("b", [[t + 30, 40.0], [t + 20, 0], [t + 10, 0]]))]
    body = _get(port, f"/query?db={data}&epoch=s&q={quote(q)}")[2]
    assert body == json.dumps({"results": [{"statement_id": 0, "series": series}]}).encode()
    # SOFFSET and SLIMIT over the series of every measurement
    q = "SELECT count(usage), count(free) FROM cpu, mem GROUP BY host SLIMIT 2 SOFFSET 2"
    body = _get(port, f"/query?db={data}&epoch=s&q={quote(q)}")[2]
    assert body == json.dumps({"results": [{"statement_id": 0, "series": [
        {"name": "cpu", "tags": {"host": "b"}, "columns": columns, "values": [[0, 2, 0]]},
        {"name": "mem", "tags": {"host": "a"}, "columns": columns, "values": [[0, 0, 1]]}]}]}).encode()


def test_chunked_1x_answer_line_by_line(iox_server, data):
    t = T0 // S
    q = "SELECT usage FROM cpu GROUP BY host"
    status, _, body = _get(iox_server.http.port, f"/query?db={data}&epoch=s&chunked=true&chunk_size=2&q={quote(q)}")

    def line(host, values, series_partial, partial):
        part = {"name": "cpu", "tags": {"host": host}, "columns": ["time", "usage"], "values": values}
        if series_partial:
            part["partial"] = True
        doc = {"statement_id": 0, "series": [part]}
        if partial:
            doc["partial"] = True
        return json.dumps({"results": [doc]}).encode()

    assert status == 200 and body.splitlines() == [
        line("", [[t + 5, 7.0]], False, True),
        line("a", [[t, 1.0], [t + 10, 2.0]], True, True), line("a", [[t + 20, 3.0], [t + 30, 4.0]], True, True),
        line("a", [[t + 40, 5.0], [t + 50, 6.0]], False, True),
        line("b", [[t, 10.0], [t + 30, 40.0]], False, False)]


def test_influxdb3_tables_of_several_measurements_over_http_and_flight(iox_server, data):
    q = "SELECT count(usage), count(free) FROM mem, cpu GROUP BY host"
    status, headers, body = _get(iox_server.http.port, f"/api/v3/query_influxql?db={data}&format=csv&q={quote(q)}")
    assert (status, headers["content-type"]) == (200, "text/csv; charset=utf-8")
    assert body.decode().splitlines() == ["iox::measurement,time,host,count,count_1",
                                          "cpu,1970-01-01 00:00:00+00:00,,1,0", "cpu,1970-01-01 00:00:00+00:00,a,6,0",
                                          "cpu,1970-01-01 00:00:00+00:00,b,2,0", "mem,1970-01-01 00:00:00+00:00,a,0,1"]
    c = InfluxDBClient3(host=f"http://127.0.0.1:{iox_server.http.port}", query_port_overwrite=iox_server.grpc_port,
                        database=data, token="unused")
    try:
        t = c.query(q, language="influxql")
        # a statement's error before its first series: the query fails, as before
        with pytest.raises(Exception, match="undefined function nope"):
            c.query("SELECT nope(usage) FROM cpu", language="influxql")
    finally:
        c.close()
    assert [str(f.type) for f in t.schema] == ["string", "timestamp[ns, tz=UTC]", "string", "int64", "int64"]
    assert t.drop_columns(["time"]).to_pylist() == [
        {"iox::measurement": "cpu", "host": "", "count": 1, "count_1": 0},
        {"iox::measurement": "cpu", "host": "a", "count": 6, "count_1": 0},
        {"iox::measurement": "cpu", "host": "b", "count": 2, "count_1": 0},
        {"iox::measurement": "mem", "host": "a", "count": 0, "count_1": 1}]
