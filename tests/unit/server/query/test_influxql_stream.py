"""server/query/influxql.py `stream` and server/api/influxql_answer.py against a fake query path
(no Spark) that hands out the rows a measurement's SQL asks for, in order, a few per batch: a
SELECT's series are made one at a time as the batches arrive, in InfluxDB's order (measurements by
name, series by tags), with fill, ORDER BY time DESC, LIMIT/OFFSET per series and SLIMIT/SOFFSET
over the stream; the 1.x documents and InfluxDB 3's table come out exactly as expected."""
from __future__ import annotations

import json
import re
import weakref

import pyarrow as pa
import pytest

from iox_spark.server.api.influxql_answer import V3Answer, v1_chunks, v1_pieces
from iox_spark.server.errors import QueryResultTooLarge
from iox_spark.server.query import influxql
from iox_spark.server.query.influxql import execute, stream

S = 1_000_000_000
TABLES = {"cpu": [("host", "tag", "string"), ("region", "tag", "string"), ("usage", "field", "float"),
                  ("n", "field", "integer")],
          "mem": [("host", "tag", "string"), ("usage", "field", "integer")]}


def _schema(groups: int, cols: list, aggregate: bool = False) -> pa.Schema:
    """The columns of a measurement's SQL: time, group-by tags, values (and the row count of a bucket)."""
    fields = [("__t", pa.int64())] + [(f"__g{i}", pa.string()) for i in range(groups)] + \
        [(f"__c{i}", t) for i, t in enumerate(cols)]
    return pa.schema(fields + ([("__n", pa.int64())] if aggregate else []))


def _rows(*rows) -> list:
    """Rows as the SQL answers them: (time, tag values..., values...) with `__n` 1 for aggregates."""
    return list(rows)


class _Result:
    """A QueryResult's surface over `rows`: `schema`, `batches()` (read once, `per_batch` rows each;
    `pulls` counts the batches handed out; `fail` = (pull, error)), `close()`."""

    def __init__(self, query, schema: pa.Schema, rows: list, per_batch: int, fail=None):
        self.query, self.schema, self.rows, self.per_batch, self.fail = query, schema, rows, per_batch, fail
        self.pulls = 0
        self.closed = False

    def batches(self):
        try:
            for i in range(0, max(len(self.rows), 1), self.per_batch):
                if self.fail is not None and self.fail[0] == self.pulls:
                    raise self.fail[1]
                self.pulls += 1
                self.query.pulled(self)
                part = [dict(zip(self.schema.names, r + ((1,) if "__n" in self.schema.names else ())))
                        for r in self.rows[i:i + self.per_batch]]
                yield pa.RecordBatch.from_pylist(part, schema=self.schema)
        finally:
            self.closed = True

    @property
    def table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches()), schema=self.schema)

    def close(self) -> None:
        self.closed = True


class _Query:
    """`run_sql`: the answer of each measurement's SQL (the table it reads), from `answers`
    {measurement: (schema, rows)}; records the SQL, the results and the live series at each pull."""

    def __init__(self, answers: dict, per_batch: int = 2, fail: dict | None = None, live=None):
        self.answers, self.per_batch, self.fail, self.live = answers, per_batch, fail or {}, live
        self.sql: dict = {}
        self.results: list = []
        self.live_at_pulls: list = []

    def __call__(self, database: str, sql: str) -> _Result:
        m = re.search(r"FROM `([^`]+)`", sql).group(1)
        self.sql[m] = sql
        schema, rows = self.answers[m]
        r = _Result(self, schema, rows, self.per_batch, self.fail.get(m))
        r.measurement = m
        self.results.append(r)
        return r

    def pulled(self, r: _Result) -> None:
        if self.live is not None:
            self.live_at_pulls.append(len(self.live))

    def result(self, m: str) -> _Result:
        [r] = [r for r in self.results if r.measurement == m]
        return r


@pytest.fixture
def live(monkeypatch):
    """The Series objects alive (made by server/query/influxql.py and not yet dropped)."""
    made = weakref.WeakValueDictionary()

    class Tracked(influxql.Series):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made[id(self)] = self

    monkeypatch.setattr(influxql, "Series", Tracked)
    return made


def _stream(text: str, q: _Query, now_ns: int = 0):
    return stream(text, "d", q, lambda db: TABLES, lambda: ["d"], now_ns)


def _doc(text: str, q: _Query, epoch: str | None = "ns") -> bytes:
    return b"".join(v1_pieces(_stream(text, q), epoch))


def _series(name, tags, columns, values) -> dict:
    out = {"name": name}
    if tags:
        out["tags"] = tags
    return {**out, "columns": columns, "values": values}


HOSTS_ABC = _rows((1 * S, "a", 1.0), (2 * S, "a", 2.0), (3 * S, "a", 3.0), (1 * S, "b", 4.0), (2 * S, "b", 5.0),
                  (3 * S, "b", 6.0), (1 * S, "c", 7.0), (2 * S, "c", 8.0), (3 * S, "c", 9.0))


def test_a_select_streams_its_series_one_at_a_time_as_the_batches_arrive(live):
    q = _Query({"cpu": (_schema(1, [pa.float64()]), HOSTS_ABC)}, per_batch=2, live=live)  # 5 batches
    results = _stream("SELECT usage FROM cpu GROUP BY host", q)
    r = next(results)
    cpu = q.result("cpu")
    assert r.error is None and cpu.pulls == 2  # the first series is made before the statement is answered
    got = []
    for s in r.series:
        got.append((s.tags["host"], cpu.pulls, s.values))
    assert got == [("a", 2, [[S, 1.0], [2 * S, 2.0], [3 * S, 3.0]]),  # made once b's first row came (batch 2 of 5)
                   ("b", 4, [[S, 4.0], [2 * S, 5.0], [3 * S, 6.0]]),
                   ("c", 5, [[S, 7.0], [2 * S, 8.0], [3 * S, 9.0]])]
    # while a batch was read, no series but the one the reader held was alive
    assert len(q.live_at_pulls) == 5 and max(q.live_at_pulls) <= 1
    assert cpu.closed and next(results, None) is None
    assert q.sql["cpu"] == ("SELECT __t, __g0, __c0 FROM (SELECT time_ns AS __t, coalesce(`host`, '') AS __g0, "
                            "`usage` AS __c0 FROM `cpu`) ORDER BY __g0, __t")


def test_the_1x_answer_is_written_a_series_at_a_time_and_is_the_whole_documents_text(live):
    q = _Query({"cpu": (_schema(1, [pa.float64()]), HOSTS_ABC)}, per_batch=2, live=live)
    pieces = []
    for piece in v1_pieces(_stream("SELECT usage FROM cpu GROUP BY host", q), "s"):
        pieces.append((piece, q.result("cpu").pulls if q.results else 0))
    doc = {"results": [{"statement_id": 0, "series": [
        _series("cpu", {"host": h}, ["time", "usage"], [[1, v], [2, v + 1], [3, v + 2]])
        for h, v in (("a", 1.0), ("b", 4.0), ("c", 7.0))]}]}
    assert b"".join(p for p, _ in pieces) == json.dumps(doc).encode()
    # each series' text is written before the batches after its last row are read
    assert [(json.loads(p.lstrip(b", ").split(b'"series": [')[-1])["tags"]["host"], n)
            for p, n in pieces if b'"values"' in p] == [("a", 2), ("b", 4), ("c", 5)]
    assert max(q.live_at_pulls) <= 1


def test_measurements_in_name_order_series_in_tag_order_all_planned_before_any_is_read():
    answers = {"cpu": (_schema(1, [pa.float64()]), _rows((5 * S, "", 7.0), (S, "a", 1.0), (2 * S, "b", 2.0))),
               "mem": (_schema(1, [pa.int64()]), _rows((S, "a", 3), (3 * S, "c", 4)))}
    q = _Query(answers)
    opened = []
    orig = q.__call__

    class Spy(_Query):
        def __call__(self, database, sql):
            opened.append([(r.measurement, r.pulls) for r in self.results])
            return orig(database, sql)

    q.__class__ = Spy
    expect = {"results": [{"statement_id": 0, "series": [
        _series("cpu", {"host": ""}, ["time", "usage"], [[5 * S, 7.0]]),
        _series("cpu", {"host": "a"}, ["time", "usage"], [[S, 1.0]]),
        _series("cpu", {"host": "b"}, ["time", "usage"], [[2 * S, 2.0]]),
        _series("mem", {"host": "a"}, ["time", "usage"], [[S, 3]]),
        _series("mem", {"host": "c"}, ["time", "usage"], [[3 * S, 4]])]}]}
    assert _doc("SELECT usage FROM mem, cpu GROUP BY host", q) == json.dumps(expect).encode()
    assert opened == [[], [("cpu", 0)]]  # cpu first (name order), both opened before a batch was read


def test_group_by_tags_orders_the_series_by_tag_name_then_value():
    # GROUP BY region, host: __g0 is region, __g1 host; the series sort by host (h < r), then region
    rows = _rows((S, "us", "a", 1.0), (S, "eu", "b", 2.0), (S, "us", "b", 3.0))
    q = _Query({"cpu": (_schema(2, [pa.float64()]), rows)})
    doc = json.loads(_doc("SELECT usage FROM cpu GROUP BY region, host", q))
    assert q.sql["cpu"].endswith("ORDER BY __g1, __g0, __t")
    assert [s["tags"] for s in doc["results"][0]["series"]] == [
        {"region": "us", "host": "a"}, {"region": "eu", "host": "b"}, {"region": "us", "host": "b"}]


@pytest.mark.parametrize("fill,a,b", [
    ("0", [[0, 1.5], [10, 0], [20, 2.5], [30, 0]], [[0, 0], [10, 4.0], [20, 0], [30, 0]]),
    ("null", [[0, 1.5], [10, None], [20, 2.5], [30, None]], [[0, None], [10, 4.0], [20, None], [30, None]]),
    ("none", [[0, 1.5], [20, 2.5]], [[10, 4.0]]),
    ("previous", [[0, 1.5], [10, 1.5], [20, 2.5], [30, 2.5]], [[0, None], [10, 4.0], [20, 4.0], [30, 4.0]]),
    ("linear", [[0, 1.5], [10, 2.0], [20, 2.5], [30, None]], [[0, None], [10, 4.0], [20, None], [30, None]]),
])
def test_group_by_time_fills_each_series_buckets(fill, a, b):
    rows = _rows((0, "a", 1.5), (20 * S, "a", 2.5), (10 * S, "b", 4.0))
    q = _Query({"cpu": (_schema(1, [pa.float64()], aggregate=True), rows)}, per_batch=1)
    text = ("SELECT mean(usage) FROM cpu WHERE time >= '1970-01-01T00:00:00Z' AND time < '1970-01-01T00:00:40Z' "
            f"GROUP BY time(10s), host fill({fill})")
    series = [_series("cpu", {"host": "a"}, ["time", "mean"], a), _series("cpu", {"host": "b"}, ["time", "mean"], b)]
    assert _doc(text, q, "s") == json.dumps({"results": [{"statement_id": 0, "series": series}]}).encode()
    assert q.sql["cpu"].endswith(" GROUP BY 1, 2) ORDER BY __g0, __t")


def test_order_by_time_desc_limit_and_offset_apply_to_each_series():
    rows = _rows((S, "a", 1.0), (2 * S, "a", 2.0), (3 * S, "a", 3.0), (S, "b", 4.0), (2 * S, "b", 5.0))
    q = _Query({"cpu": (_schema(1, [pa.float64()]), rows)})
    assert json.loads(_doc("SELECT usage FROM cpu GROUP BY host ORDER BY time DESC LIMIT 2", q, "s")) == {
        "results": [{"statement_id": 0, "series": [
            _series("cpu", {"host": "a"}, ["time", "usage"], [[3, 3.0], [2, 2.0]]),
            _series("cpu", {"host": "b"}, ["time", "usage"], [[2, 5.0], [1, 4.0]])]}]}
    q = _Query({"cpu": (_schema(1, [pa.float64()]), rows)})
    assert json.loads(_doc("SELECT usage FROM cpu GROUP BY host ORDER BY time DESC LIMIT 2 OFFSET 1", q, "s")) == {
        "results": [{"statement_id": 0, "series": [
            _series("cpu", {"host": "a"}, ["time", "usage"], [[2, 2.0], [1, 1.0]]),
            _series("cpu", {"host": "b"}, ["time", "usage"], [[1, 4.0]])]}]}
    # a series left without rows is no series: SOFFSET counts only those with rows
    q = _Query({"cpu": (_schema(1, [pa.float64()]), rows)})
    assert json.loads(_doc("SELECT usage FROM cpu GROUP BY host LIMIT 1 OFFSET 2 SOFFSET 0", q, "s")) == {
        "results": [{"statement_id": 0, "series": [
            _series("cpu", {"host": "a"}, ["time", "usage"], [[3, 3.0]])]}]}


def test_slimit_and_soffset_over_the_stream_read_no_further_than_needed():
    answers = {"cpu": (_schema(1, [pa.float64()]), _rows((S, "a", 1.0), (S, "b", 2.0), (S, "c", 3.0))),
               "mem": (_schema(1, [pa.int64()]), _rows((S, "a", 4), (2 * S, "a", 5), (S, "b", 6), (2 * S, "b", 7)))}
    q = _Query(answers, per_batch=1)
    assert json.loads(_doc("SELECT usage FROM cpu, mem GROUP BY host SLIMIT 2 SOFFSET 2", q, "s")) == {
        "results": [{"statement_id": 0, "series": [
            _series("cpu", {"host": "c"}, ["time", "usage"], [[1, 3.0]]),
            _series("mem", {"host": "a"}, ["time", "usage"], [[1, 4], [2, 5]])]}]}
    assert (q.result("mem").pulls, q.result("mem").closed) == (3, True)  # up to b's first row, then closed
    q = _Query(answers, per_batch=1)
    assert json.loads(_doc("SELECT usage FROM cpu, mem GROUP BY host SLIMIT 1", q, "s"))["results"][0]["series"] == [
        _series("cpu", {"host": "a"}, ["time", "usage"], [[1, 1.0]])]
    assert [(r.measurement, r.pulls, r.closed) for r in q.results] == [("cpu", 2, True), ("mem", 0, True)]
    q = _Query(answers, per_batch=1)
    assert _doc("SELECT usage FROM cpu, mem GROUP BY host SOFFSET 9", q) == b'{"results": [{"statement_id": 0}]}'


def test_errors_before_the_first_series_are_the_statements_after_it_they_end_the_stream():
    too_large = QueryResultTooLarge("bytes", 5, "--max-query-bytes")
    answers = {"cpu": (_schema(1, [pa.float64()]), HOSTS_ABC), "mem": (_schema(1, [pa.int64()]), _rows((S, "a", 3)))}
    q = _Query(answers, fail={"cpu": (1, too_large)})  # the second batch, before series a is complete
    text = "SELECT usage FROM cpu GROUP BY host; SELECT nope(x) FROM cpu; SELECT usage FROM mem"
    assert json.loads(_doc(text, q, "s")) == {"results": [
        {"statement_id": 0, "error": str(too_large)},
        {"statement_id": 1, "error": "undefined function nope()"},
        {"statement_id": 2, "series": [_series("mem", None, ["time", "usage"], [[1, 3]])]}]}
    assert all(r.closed for r in q.results)
    # after the first series: the stream ends with the error, the answer is never a whole-looking one
    q = _Query(answers, fail={"cpu": (2, too_large)})
    pieces = v1_pieces(_stream(text, q), "s")
    written = []
    with pytest.raises(QueryResultTooLarge):
        for p in pieces:
            written.append(p)
    assert b'"host": "a"' in b"".join(written) and q.result("cpu").closed and "mem" not in q.sql
    with pytest.raises(ValueError):
        json.loads(b"".join(written))
    # read whole (`execute`), the error is the statement's, as before
    q = _Query(answers, fail={"cpu": (2, too_large)})
    results = execute(text, "d", q, lambda db: TABLES, lambda: ["d"], 0)
    assert [(r.error, len(r.series)) for r in results] == [(str(too_large), 0), ("undefined function nope()", 0),
                                                           (None, 1)]


def test_a_statement_runs_once_the_previous_ones_series_were_read():
    answers = {"cpu": (_schema(0, [pa.float64()]), _rows((S, 1.0))),
               "mem": (_schema(1, [pa.int64()]), _rows((S, "a", 3), (S, "b", 4)))}
    q = _Query(answers, per_batch=1)
    results = _stream("SELECT usage FROM cpu; SELECT usage FROM mem GROUP BY host", q)
    first = next(results)
    assert [r.measurement for r in q.results] == ["cpu"]
    assert [s.values for s in first.series] == [[[S, 1.0]]]
    second = next(results)
    assert [r.measurement for r in q.results] == ["cpu", "mem"] and q.result("cpu").closed
    # a statement skipped unread is closed before the next one runs
    assert not q.result("mem").closed
    results.close()
    assert q.result("mem").closed and second.error is None


def test_rows_out_of_series_order_never_make_a_series_twice():
    rows = _rows((S, "b", 1.0), (S, "a", 2.0))
    q = _Query({"cpu": (_schema(1, [pa.float64()]), rows)}, per_batch=1)
    with pytest.raises(RuntimeError, match="did not come in series order"):
        next(_stream("SELECT usage FROM cpu GROUP BY host", q))
    assert q.result("cpu").closed
    rows = _rows((S, "a", 1.0), (S, "b", 2.0), (S, "a", 3.0))
    q = _Query({"cpu": (_schema(1, [pa.float64()]), rows)}, per_batch=1)
    r = next(_stream("SELECT usage FROM cpu GROUP BY host", q))
    with pytest.raises(RuntimeError, match="did not come in series order"):
        list(r.series)
    assert q.result("cpu").closed


def test_one_measurement_read_twice_merges_its_series_in_tag_order():
    # FROM cpu, (SELECT usage FROM cpu): two sources named cpu; one series of each per host, the
    # table's first on a tie (FROM's order)
    class Q(_Query):
        def __call__(self, database, sql):
            self.n = getattr(self, "n", 0) + 1
            schema, rows = self.answers["cpu"]
            r = _Result(self, schema, [(t, h, v + 10 * (self.n - 1)) for t, h, v in rows], self.per_batch)
            r.measurement = f"cpu{self.n}"
            self.results.append(r)
            return r

    q = Q({"cpu": (_schema(1, [pa.float64()]), _rows((S, "a", 1.0), (S, "b", 2.0)))})
    doc = json.loads(_doc("SELECT usage FROM cpu, (SELECT usage FROM cpu) GROUP BY host", q, "s"))
    assert [(s["tags"]["host"], s["values"]) for s in doc["results"][0]["series"]] == [
        ("a", [[1, 1.0]]), ("a", [[1, 11.0]]), ("b", [[1, 2.0]]), ("b", [[1, 12.0]])]


def test_chunked_1x_answer_marks_every_piece_but_a_statements_last_partial():
    rows = _rows((S, "a", 1.0), (2 * S, "a", 2.0), (3 * S, "a", 3.0), (S, "b", 4.0))
    q = _Query({"cpu": (_schema(1, [pa.float64()]), rows), "mem": (_schema(1, [pa.int64()]), [])})
    lines = b"".join(v1_chunks(_stream("SELECT usage FROM cpu GROUP BY host; SELECT usage FROM mem; SELECT x(y) "
                                       "FROM cpu", q), "s", 2)).splitlines()

    def line(part, partial):
        doc = {"statement_id": 0, "series": [part]}
        if partial:
            doc["partial"] = True
        return json.dumps({"results": [doc]}).encode()

    a = _series("cpu", {"host": "a"}, ["time", "usage"], [[1, 1.0], [2, 2.0]])
    assert lines == [line({**a, "partial": True}, True),
                     line(_series("cpu", {"host": "a"}, ["time", "usage"], [[3, 3.0]]), True),
                     line(_series("cpu", {"host": "b"}, ["time", "usage"], [[1, 4.0]]), False),
                     b'{"results": [{"statement_id": 1}]}',
                     b'{"results": [{"statement_id": 2, "error": "undefined function x()"}]}']


def test_influxdb3_table_has_every_measurements_columns_typed_before_its_first_row():
    answers = {"cpu": (_schema(2, [pa.float64()]), _rows((S, "a", "eu", 1.5), (S, "b", "us", 2.0))),
               "mem": (_schema(1, [pa.int64()]), _rows((2 * S, "a", 3)))}
    q = _Query(answers, per_batch=1)
    results = _stream("SELECT usage FROM mem, cpu GROUP BY *", q)
    answer = V3Answer(next(results))
    assert answer.schema == pa.schema([("iox::measurement", pa.string()), ("time", pa.timestamp("ns", tz="UTC")),
                                       ("host", pa.string()), ("region", pa.string()), ("usage", pa.float64())])
    # the schema is known with the first series made: only as much as that was read
    assert [(r.measurement, r.pulls) for r in q.results] == [("cpu", 2), ("mem", 0)]
    assert q.sql["cpu"].endswith("ORDER BY __g0, __g1, __t")
    batches = list(answer.batches())
    answer.close()
    assert len(batches) == 1  # small series gathered in one batch
    t = pa.Table.from_batches(batches)
    assert t.column("time").cast(pa.int64()).to_pylist() == [S, S, 2 * S]
    assert t.drop_columns(["time"]).to_pylist() == [
        {"iox::measurement": "cpu", "host": "a", "region": "eu", "usage": 1.5},
        {"iox::measurement": "cpu", "host": "b", "region": "us", "usage": 2.0},
        {"iox::measurement": "mem", "host": "a", "region": None, "usage": 3.0}]  # ints and floats: floats
    # kinds that do not go together are text; a statement without series has only the measurement
    answers = {"cpu": (_schema(0, [pa.string()]), _rows((S, "x"))), "mem": (_schema(0, [pa.int64()]), _rows((S, 3)))}
    r = next(_stream("SELECT usage FROM cpu, mem", _Query(answers)))
    t = pa.Table.from_batches(list(V3Answer(r).batches()))
    assert t.schema.field("usage").type == pa.string() and t.column("usage").to_pylist() == ["x", "3"]
    r = next(_stream("SELECT usage FROM cpu", _Query({"cpu": (_schema(0, [pa.float64()]), [])})))
    empty = V3Answer(r)
    assert empty.schema == pa.schema([("iox::measurement", pa.string())])
    assert sum(b.num_rows for b in empty.batches()) == 0


def test_influxdb3_column_types_follow_fill_and_transformations():
    agg = _schema(0, [pa.int64()], aggregate=True)
    rows = _rows((0, 1), (20 * S, 3))
    where = "WHERE time >= '1970-01-01T00:00:00Z' AND time < '1970-01-01T00:00:30Z'"
    for text, typ, values in (
            (f"SELECT count(n) FROM cpu {where} GROUP BY time(10s) fill(linear)", pa.float64(), [1.0, 2.0, 3.0]),
            (f"SELECT count(n) FROM cpu {where} GROUP BY time(10s) fill(7)", pa.int64(), [1, 7, 3]),
            (f"SELECT count(n) FROM cpu {where} GROUP BY time(10s) fill(0.5)", pa.float64(), [1.0, 0.5, 3.0]),
            (f"SELECT count(n) FROM cpu {where} GROUP BY time(10s) fill(null)", pa.int64(), [1, None, 3]),
            (f"SELECT difference(count(n)) FROM cpu {where} GROUP BY time(10s) fill(none)", pa.int64(), [2]),
            (f"SELECT derivative(count(n), 10s) FROM cpu {where} GROUP BY time(10s) fill(none)", pa.float64(), [1.0])):
        r = next(_stream(text, _Query({"cpu": (agg, rows)})))
        answer = V3Answer(r)
        t = pa.Table.from_batches(list(answer.batches()), schema=answer.schema)
        assert (t.schema.field(2).type, t.column(2).to_pylist()) == (typ, values), text
