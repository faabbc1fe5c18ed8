"""server/query/influxql_parse.py and the pure parts of server/query/influxql.py: InfluxQL parses
into its tree or fails naming where; times and durations read as InfluxDB reads them."""
from __future__ import annotations

import pytest

from iox_spark.server.query.influxql import InfluxQLError, execute, parse_time_ns
from iox_spark.server.query.influxql_parse import (Binary, Call, DurationLit, Field, Ident, InfluxQLSyntaxError, Now, RegexLit,
                                         Select, Show, Source, StringLit, Wildcard, duration_ns, parse)


def test_grafanas_query_parses_whole():
    [st] = parse('SELECT mean("usage") AS "m" FROM "telegraf"."autogen"."cpu" WHERE ("host" =~ /^a\\/b$/) AND '
                 'time >= now() - 6h and time <= 1700000000000ms GROUP BY time(1m, 10s), "host"::tag fill(linear) '
                 "ORDER BY time DESC LIMIT 5 OFFSET 1 SLIMIT 2 SOFFSET 3 tz('Europe/Paris')")
    assert isinstance(st, Select)
    assert st.fields == [Field(Call("mean", (Ident("usage"),)), "m")]
    assert st.sources == [Source(name="cpu")]
    assert st.condition == Binary("AND", Binary("AND", Binary("=~", Ident("host"), RegexLit("^a/b$")),
                                                Binary(">=", Ident("time"), Binary("-", Now(), DurationLit(6 * 3600 * 10**9)))),
                                  Binary("<=", Ident("time"), DurationLit(1_700_000_000_000 * 10**6)))
    assert st.dimensions == [Call("time", (DurationLit(60 * 10**9), DurationLit(10 * 10**9))), Ident("host", "tag")]
    assert (st.fill, st.order_desc, st.limit, st.offset, st.slimit, st.soffset, st.tz) == \
        ("linear", True, 5, 1, 2, 3, "Europe/Paris")


def test_statements_and_shows():
    a, b, c = parse("SELECT * FROM /^c/; SHOW TAG VALUES FROM cpu WITH KEY =~ /h.*/ WHERE a = 'x' LIMIT 2;"
                    "show field keys on db")
    assert a.fields == [Field(Wildcard())] and a.sources == [Source(regex="^c")]
    assert isinstance(b, Show) and (b.what, b.key_op, b.keys, b.limit) == ("tag values", "=~", RegexLit("h.*"), 2)
    assert b.condition == Binary("=", Ident("a"), StringLit("x"))
    assert (c.what, c.on) == ("field keys", "db")


@pytest.mark.parametrize("text,message", [
    ("SELEC x FROM m", "found SELEC, expected SELECT or SHOW"),
    ("SELECT x FROM", "expected measurement"),
    ("SELECT x FROM m WHERE host =~ 'a'", "expected regex"),
    ("SELECT x FROM m GROUP BY time(1m) fill(sideways)", "expected null, none, previous, linear or a number"),
    ("SELECT x FROM m ORDER BY host", "only ORDER BY time"),
    ("SELECT x FROM m WHERE a = 'b", "unterminated string"),
    ("DROP MEASUREMENT m", "expected SELECT or SHOW"),
    ("", "empty query"),
])
def test_what_does_not_parse_says_where(text, message):
    with pytest.raises(InfluxQLSyntaxError, match=message) as e:
        parse(text)
    assert str(e.value).startswith("error parsing query: ")


def test_durations_and_times():
    assert duration_ns("1h30m") == 5400 * 10**9 and duration_ns("5u") == 5000 and duration_ns("2w") == 1209600 * 10**9
    assert parse_time_ns("2023-11-14T22:13:20Z") == 1_700_000_000 * 10**9
    assert parse_time_ns("2023-11-14T22:13:20.000000001Z") == 1_700_000_000 * 10**9 + 1
    assert parse_time_ns("2023-11-14 23:13:20+01:00") == 1_700_000_000 * 10**9
    assert parse_time_ns("2023-11-14") == 1_699_920_000 * 10**9
    with pytest.raises(InfluxQLError, match="invalid time"):
        parse_time_ns("yesterday")


def test_a_statement_error_leaves_the_others_and_a_database_is_needed():
    tables = {"m": [("x", "field", "float")]}
    results = execute("SELECT x FROM (SELECT x FROM m); SHOW DATABASES; SHOW MEASUREMENTS", "",
                      run_sql=lambda db, sql: pytest.fail("no SQL runs"), tables=lambda db: tables,
                      databases=lambda: ["d1", "d2"], now_ns=0)
    assert results[0].error == "database name required"
    assert [s.values for s in results[1].series] == [[["d1"], ["d2"]]]
    assert results[2].error == "database name required"
    results = execute("SELECT x FROM (SELECT x FROM m LIMIT 1); SELECT mean(x), x FROM m", "d",
                      run_sql=lambda db, sql: pytest.fail("no SQL runs"), tables=lambda db: tables,
                      databases=lambda: [], now_ns=0)
    assert [r.error for r in results] == [
        "ORDER BY, LIMIT, OFFSET, SLIMIT and SOFFSET in a subquery are not supported",
        "mixing aggregate and non-aggregate queries is not supported"]


def test_parameters_stand_for_literals_and_must_fit_the_placeholders():
    [st] = parse("SELECT x FROM m WHERE host = $host AND x > $min AND ok = $ok", {"host": "a' OR 'b", "min": -2,
                                                                                "ok": True})
    assert st.condition.left.left.right == StringLit("a' OR 'b")
    assert st.condition.left.right.right.value == -2 and st.condition.right.right.value is True
    with pytest.raises(InfluxQLSyntaxError, match=r"no value is given for the parameter \$host"):
        parse("SELECT x FROM m WHERE host = $host")
    with pytest.raises(InfluxQLSyntaxError, match=r"\$extra given but not used"):
        parse("SELECT x FROM m", {"extra": 1})
    with pytest.raises(InfluxQLSyntaxError, match="must be a string, number or boolean"):
        parse("SELECT x FROM m WHERE a = $a", {"a": [1]})


def test_a_transformation_of_values_it_cannot_take_is_that_statements_error():
    import pyarrow as pa

    tables = {"m": [("s", "field", "string"), ("x", "field", "float")]}
    rows = pa.table({"__t": [1, 2], "__c0": ["a", "b"]})
    [r] = execute("SELECT derivative(s) FROM m", "d", run_sql=lambda db, sql: rows, tables=lambda db: tables,
                  databases=lambda: [], now_ns=0)
    assert r.error.startswith("cannot compute this statement over the values it reads") and r.series == []
