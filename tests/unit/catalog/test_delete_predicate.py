"""Unit tests for catalog.delete_predicate (the IOx-style delete predicate language).

* parse_time: RFC3339 (offsets, 9 fractional digits kept exactly), integer ns, garbage;
* parse_predicate: valid conjunctions, and rejections (OR, parentheses, other operators,
  unterminated strings, bad escapes, column vs column, trailing garbage) with positions;
* validate_against_schema: unknown columns, time, type compatibility and ranges;
* Spark SQL rendering (strings only; no Spark here) and JSON round trip;
* hypothesis: parse(render(terms)) == terms; from_json(to_json(terms)) == terms;
  arbitrary text either parses completely or raises InvalidDelete (never anything else).
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.catalog import delete_predicate as dp
from iox_spark.catalog.delete_predicate import (
    InvalidDelete,
    Term,
    from_json,
    parse_predicate,
    parse_time,
    parse_time_range,
    predicate_sql,
    render_predicate,
    term_to_sql,
    to_json,
    validate_against_schema,
)
from iox_spark.chunk_store.views import quote

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1
NS = 1_000_000_000
T2024 = 1704067200 * NS  # 2024-01-01T00:00:00Z


def S(c, v, op="="):
    return Term(c, op, v, "string")


def I(c, v, op="="):
    return Term(c, op, v, "integer")


def F(c, v, op="="):
    return Term(c, op, v, "float")


def B(c, v, op="="):
    return Term(c, op, v, "boolean")


# --------------------------------------------------------------------------- InvalidDelete

def test_invalid_delete_fields_and_str():
    e = InvalidDelete("start", "bad")
    assert isinstance(e, ValueError)
    assert (e.field, e.reason) == ("start", "bad")
    assert str(e) == "invalid delete start: bad"


def test_module_exports():
    for name in ["InvalidDelete", "Term", "parse_time", "parse_predicate", "validate_against_schema",
                 "term_to_sql", "predicate_sql", "to_json", "from_json"]:
        assert name in dp.__all__
    assert "never partially" in dp.__doc__


# --------------------------------------------------------------------------- parse_time

@pytest.mark.parametrize("text,expected", [
    ("2024-01-01T00:00:00Z", T2024),
    ("2024-01-01t00:00:00z", T2024),
    ("1970-01-01T00:00:00Z", 0),
    ("1970-01-01T00:00:00.000000001Z", 1),
    ("1969-12-31T23:59:59.999999999Z", -1),
    ("2024-01-01T00:00:00.123456789Z", T2024 + 123_456_789),
    ("2024-01-01T00:00:00.123456789+02:00", T2024 - 2 * 3600 * NS + 123_456_789),
    ("2024-01-01T00:00:00.1-05:30", T2024 + (5 * 3600 + 30 * 60) * NS + 100_000_000),
    ("2024-01-01T00:00:00.000001Z", T2024 + 1000),
    ("2024-01-01T00:00:00+00:00", T2024),
    ("2024-01-01T00:00:00-00:00", T2024),
    ("2024-02-29T12:34:56Z", T2024 + (59 * 86400 + 12 * 3600 + 34 * 60 + 56) * NS),
    ("2262-04-11T23:47:16.854775807Z", I64_MAX),
    ("1677-09-21T00:12:43.145224192Z", I64_MIN),
    ("0", 0),
    ("1704067200000000000", T2024),
    ("-1", -1),
    ("-1000000000", -NS),
    (str(I64_MAX), I64_MAX),
    (str(I64_MIN), I64_MIN),
    ("  2024-01-01T00:00:00Z \n", T2024),
])
def test_parse_time_valid(text, expected):
    assert parse_time(text, "start") == expected


def test_parse_time_fraction_is_exact():
    # 9 digits that a float/microsecond path would lose.
    for frac in ["999999999", "000000001", "123456789", "987654321", "500000001"]:
        assert parse_time(f"2024-01-01T00:00:00.{frac}Z") - T2024 == int(frac)


@pytest.mark.parametrize("text", [
    "", "   ", "now", "2024-01-01", "2024-01-01T00:00:00", "2024-01-01 00:00:00Z",
    "2024-13-01T00:00:00Z", "2023-02-29T00:00:00Z", "2024-01-32T00:00:00Z",
    "2024-01-01T24:00:00Z", "2024-01-01T00:60:00Z", "2024-01-01T00:00:60Z",
    "2024-01-01T00:00:00.Z", "2024-01-01T00:00:00.1234567891Z", "2024-01-01T00:00:00+2:00",
    "2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00+02:60", "2024-01-01T00:00:00+0200",
    "1.5", "1e9", "+5", "--1", "0x10", "12abc", "2262-04-11T23:47:16.854775808Z",
    str(I64_MAX + 1), str(I64_MIN - 1), "0000-01-01T00:00:00Z", "٣", "²", "١٧٠٤٠٦٧٢٠٠",
    "٢٠٢٤-01-01T00:00:00Z", "2024-01-01T00:00:00.١Z",
])
def test_parse_time_invalid(text):
    with pytest.raises(InvalidDelete) as ei:
        parse_time(text, "stop")
    assert ei.value.field == "stop"
    assert ei.value.reason


def test_parse_time_field_default_and_passthrough():
    with pytest.raises(InvalidDelete) as ei:
        parse_time("garbage", field="start")
    assert ei.value.field == "start" and "garbage" in ei.value.reason
    with pytest.raises(InvalidDelete) as ei:
        parse_time("2024-01-01T00:00:00.1234567891Z", field="start")
    assert "fractional digits" in ei.value.reason


def test_parse_time_range():
    assert parse_time_range("0", "2024-01-01T00:00:00Z") == (0, T2024)
    with pytest.raises(InvalidDelete) as ei:
        parse_time_range("10", "10")
    assert ei.value.field == "stop"
    with pytest.raises(InvalidDelete) as ei:
        parse_time_range("x", "10")
    assert ei.value.field == "start"
    with pytest.raises(InvalidDelete) as ei:
        parse_time_range("10", "y")
    assert ei.value.field == "stop"


# --------------------------------------------------------------------------- parse_predicate: valid

@pytest.mark.parametrize("text,expected", [
    ("", []),
    ("   \t\n ", []),
    ("host = 'a'", [S("host", "a")]),
    ("host='a'", [S("host", "a")]),
    ('host = "a"', [S("host", "a")]),
    ("host != 'a'", [S("host", "a", "!=")]),
    ("host!='a'", [S("host", "a", "!=")]),
    ("host = ''", [S("host", "")]),
    ("host = 'a' AND region = 'us'", [S("host", "a"), S("region", "us")]),
    ("host = 'a' and region = 'us' AnD x != 1", [S("host", "a"), S("region", "us"), I("x", 1, "!=")]),
    ("  host = 'a'  ", [S("host", "a")]),
    ("x = 1", [I("x", 1)]),
    ("x = -1", [I("x", -1)]),
    ("x = 0", [I("x", 0)]),
    ("x = -0", [I("x", 0)]),
    ("x = 007", [I("x", 7)]),
    (f"x = {U64_MAX}", [I("x", U64_MAX)]),
    (f"x = {I64_MIN}", [I("x", I64_MIN)]),
    ("x = 1.5", [F("x", 1.5)]),
    ("x = -2.0", [F("x", -2.0)]),
    ("x = -0.5", [F("x", -0.5)]),
    ("x = 1e3", [F("x", 1000.0)]),
    ("x = 1E3", [F("x", 1000.0)]),
    ("x = 1e-3", [F("x", 0.001)]),
    ("x = 2.5e+2", [F("x", 250.0)]),
    ("x = .5", [F("x", 0.5)]),
    ("x = -.5", [F("x", -0.5)]),
    ("x = 1.", [F("x", 1.0)]),
    ("x = 0.1", [F("x", 0.1)]),
    ("b = true", [B("b", True)]),
    ("b = FALSE", [B("b", False)]),
    ("b != True", [B("b", True, "!=")]),
    ("_a.b-c9 = 'x'", [S("_a.b-c9", "x")]),
    ("`my col` = 'x'", [S("my col", "x")]),
    ("`a``b` = 'x'", [S("a`b", "x")]),
    ("`and` = 'x'", [S("and", "x")]),
    ("`time zone` = 'x'", [S("time zone", "x")]),
    ("`höst` = 'ünïcode ✓ 日本'", [S("höst", "ünïcode ✓ 日本")]),
    ("`a = 'b' OR c` = 'x'", [S("a = 'b' OR c", "x")]),
    (r"s = 'it\'s'", [S("s", "it's")]),
    (r's = "say \"hi\""', [S("s", 'say "hi"')]),
    (r"s = 'back\\slash'", [S("s", "back\\slash")]),
    (r"s = '\\'", [S("s", "\\")]),
    (r"""s = 'a"b'""", [S("s", 'a"b')]),
    (r'''s = "a'b"''', [S("s", "a'b")]),
    (r'''s = 'a\"b' ''', [S("s", 'a"b')]),
    ("s = 'a OR b AND (c)'", [S("s", "a OR b AND (c)")]),
    ("s = 'line\nbreak'", [S("s", "line\nbreak")]),
    ("s = '1'", [S("s", "1")]),
    ("s = 'true'", [S("s", "true")]),
    ("a=1 AND b='x'AND c=true", [I("a", 1), S("b", "x"), B("c", True)]),
    ("a = 1 AND a = 2", [I("a", 1), I("a", 2)]),
    ("Time_ = 5", [I("Time_", 5)]),
])
def test_parse_valid(text, expected):
    assert parse_predicate(text) == expected


def test_parse_value_types_are_exact():
    [t] = parse_predicate("x = 1")
    assert type(t.value) is int and t.kind == "integer"
    [t] = parse_predicate("x = 1.0")
    assert type(t.value) is float and t.kind == "float"
    [t] = parse_predicate("x = 1e3")
    assert type(t.value) is float and t.kind == "float"
    [t] = parse_predicate("x = true")
    assert t.value is True and t.kind == "boolean"
    [t] = parse_predicate("x = 9007199254740993")
    assert t.value == 9007199254740993  # not rounded through float


# --------------------------------------------------------------------------- parse_predicate: invalid

@pytest.mark.parametrize("text,fragments", [
    ("a = 1 OR b = 2", ["OR", "position 6"]),
    ("a = 1 or b = 2", ["OR", "position 6"]),
    ("OR a = 1", ["OR", "position 0"]),
    ("a > 1", ["'>'", "position 2"]),
    ("a < 1", ["'<'", "position 2"]),
    ("a >= 1", ["'>='", "position 2"]),
    ("a <= 1", ["'<='", "position 2"]),
    ("a <> 1", ["'<>'", "position 2"]),
    ("a == 1", ["'=='", "position 2"]),
    ("a ! 1", ["'!'", "position 2"]),
    ("a =! 1", ["'=!'", "position 2"]),
    ("a ~ 'x'", ["'~'", "position 2"]),
    ("a LIKE 'x%'", ["LIKE", "position 2"]),
    ("a IN ('x')", ["IN", "position 2"]),
    ("a is null", ["IS", "position 2"]),
    ("a NOT LIKE 'x'", ["NOT", "position 2"]),
    ("a BETWEEN 1 AND 2", ["BETWEEN", "position 2"]),
    ("NOT a = 1", ["NOT", "position 0", "!="]),
    ("(a = 1)", ["parentheses", "position 0"]),
    ("a = (1)", ["parentheses", "position 4"]),
    ("a = 1 AND (b = 2)", ["parentheses", "position 10"]),
    ("a = 1)", ["parentheses", "position 5"]),
    ("a = ", ["literal", "end of input", "position 4"]),
    ("a =", ["literal", "end of input", "position 3"]),
    ("a != ", ["literal", "'!='"]),
    ("a", ["= or !=", "end of input", "position 1"]),
    ("a 'x'", ["= or !=", "position 2"]),
    ("a b = 1", ["= or !=", "position 2"]),
    ("= 1", ["column name", "position 0"]),
    ("1 = a", ["column name", "position 0"]),
    ("'a' = 'b'", ["column name", "position 0"]),
    ('"a" = 1', ["column name", "double quotes", "backticks"]),
    ("a = 'x", ["unterminated string", "position 4"]),
    ('a = "x', ["unterminated string", "position 4"]),
    ("a = 'x\\'", ["unterminated string", "position 4"]),
    ("a = 'x\\", ["unterminated string", "backslash"]),
    ("a = 'x\\n'", ["escape", "position 6"]),
    ("a = 'C:\\path'", ["escape", "'\\p'", "position 7"]),
    ("a = ٣", ["unexpected character", "position 4"]),
    ("a = ²", ["unexpected character", "position 4"]),
    ("`a = 1", ["unterminated backtick", "position 0"]),
    ("`` = 1", ["empty column name", "position 0"]),
    ("a = b", ["column", "position 4", "column to a column"]),
    ("a = `b`", ["column to a column", "position 4"]),
    ("a = null", ["NULL", "position 4"]),
    ("a = 1 xyz", ["unexpected", "'xyz'", "position 6", "AND"]),
    ("a = 1 2", ["unexpected", "number 2", "position 6"]),
    ("a = 1 'x'", ["unexpected", "position 6"]),
    ("a = 1 = 2", ["unexpected operator", "position 6"]),
    ("a = 1 AND", ["column name", "end of input", "position 9", "after AND at position 6"]),
    ("a = 1 AND AND b = 2", ["keyword", "position 10"]),
    ("AND a = 1", ["keyword", "position 0"]),
    ("a = 1,b = 2", ["unexpected", "','", "position 5"]),
    ("a = 1; DROP TABLE x", ["unexpected character", "';'", "position 5"]),
    ("a = 1 && b = 2", ["unexpected character", "position 6"]),
    ("a = 1 || b = 2", ["unexpected character", "position 6"]),
    ("a = 1.2.3", ["malformed number", "position 4"]),
    ("a = 1e", ["malformed number", "position 4"]),
    ("a = 12abc", ["malformed number", "'12abc'"]),
    ("a = 1+2", ["malformed number"]),
    ("a = 5-3", ["malformed number"]),
    ("a = +1", ["unexpected character", "'+'", "position 4"]),
    ("a = -", ["unexpected character", "'-'", "position 4"]),
    ("a = .", ["malformed number", "position 4"]),
    ("a = 1e999", ["out of range", "position 4"]),
    (f"a = {U64_MAX + 1}", ["out of range", "position 4"]),
    (f"a = {I64_MIN - 1}", ["out of range", "position 4"]),
    ("a = nan", ["column to a column"]),
    ("a = inf", ["column to a column"]),
    ("true = 1", ["keyword", "backticks"]),
    ("höst = 'x'", ["unexpected character", "position 1"]),
    ("a = ‘x’", ["unexpected character", "position 4"]),
    ("a = 'x' AND b", ["= or !=", "end of input"]),
    ("a = 1 OR", ["OR"]),
    ("a = 'x'garbage", ["unexpected", "'garbage'", "position 7"]),
])
def test_parse_invalid(text, fragments):
    with pytest.raises(InvalidDelete) as ei:
        parse_predicate(text)
    e = ei.value
    assert e.field == "predicate"
    for frag in fragments:
        assert frag in e.reason, (frag, e.reason)
    assert str(e).startswith("invalid delete predicate: ")


def test_parse_reports_first_error_in_reading_order():
    # '>' comes before the garbage character; it must be what is reported.
    with pytest.raises(InvalidDelete) as ei:
        parse_predicate("a > 1 $")
    assert "'>'" in ei.value.reason


def test_parse_non_string():
    with pytest.raises(InvalidDelete):
        parse_predicate(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidDelete):
        parse_time(5, "start")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Term

def test_term_is_frozen_and_validated():
    t = S("a", "x")
    with pytest.raises(Exception):
        t.column = "b"  # type: ignore[misc]
    for bad in [("", "=", "x", "string"), ("a", "<", "x", "string"), ("a", "=", "x", "text"),
                ("a", "=", 1, "string"), ("a", "=", True, "integer"), ("a", "=", 1, "boolean"),
                ("a", "=", 1, "float"), ("a", "=", math.nan, "float"), ("a", "=", math.inf, "float"),
                ("a", "=", U64_MAX + 1, "integer"), ("a", "=", 1.0, "integer")]:
        with pytest.raises(ValueError):
            Term(*bad)
    assert hash(S("a", "x")) == hash(S("a", "x"))


# --------------------------------------------------------------------------- schema

SCHEMA = {
    "host": ("tag", "string"),
    "region": ("tag", "string"),
    "usage": ("field", "float"),
    "count": ("field", "integer"),
    "bytes": ("field", "uinteger"),
    "msg": ("field", "string"),
    "ok": ("field", "boolean"),
    "time": ("time", "time"),
}


@pytest.mark.parametrize("text", [
    "", "host = 'a'", "host != 'a' AND region = 'b'", "usage = 1.5", "usage = 2", "usage = -1e3",
    "count = -5", f"count = {I64_MAX}", f"count = {I64_MIN}", "bytes = 0", f"bytes = {U64_MAX}",
    "msg = 'hi'", "ok = true", "ok != false",
])
def test_schema_valid(text):
    assert validate_against_schema(parse_predicate(text), SCHEMA, "cpu") is None


@pytest.mark.parametrize("text,fragments", [
    ("nope = 'x'", ["unknown column", "'nope'", "'cpu'"]),
    ("time = 5", ["time", "[start, stop)"]),
    ("time != '2024'", ["time"]),
    ("host = 1", ["'host'", "tag", "integer"]),
    ("host = true", ["'host'", "boolean"]),
    ("msg = 1.5", ["'msg'", "string", "float"]),
    ("usage = 'x'", ["'usage'", "float", "string"]),
    ("usage = true", ["'usage'", "float", "boolean"]),
    ("count = 1.0", ["'count'", "integer", "float"]),
    ("count = 1e3", ["'count'", "integer", "float"]),
    ("count = 'x'", ["'count'", "integer", "string"]),
    (f"count = {I64_MAX + 1}", ["out of range", "'count'"]),
    ("bytes = -1", ["out of range", "'bytes'", "uinteger"]),
    ("bytes = 1.0", ["'bytes'", "uinteger", "float"]),
    ("ok = 1", ["'ok'", "boolean", "integer"]),
    ("ok = 'true'", ["'ok'", "boolean", "string"]),
    ("host = 'a' AND nope = 1", ["unknown column", "'nope'"]),
])
def test_schema_invalid(text, fragments):
    with pytest.raises(InvalidDelete) as ei:
        validate_against_schema(parse_predicate(text), SCHEMA, "cpu")
    assert ei.value.field == "predicate"
    for frag in fragments:
        assert frag in ei.value.reason, (frag, ei.value.reason)


def test_schema_unknown_without_table():
    with pytest.raises(InvalidDelete) as ei:
        validate_against_schema([S("nope", "x")], SCHEMA, None)
    assert "'nope'" in ei.value.reason and "table" not in ei.value.reason
    with pytest.raises(InvalidDelete) as ei:
        validate_against_schema([S("nope", "x")], SCHEMA, "")
    assert "table" not in ei.value.reason


def test_schema_time_rejected_even_when_absent_or_renamed():
    with pytest.raises(InvalidDelete, match="time"):
        validate_against_schema([I("time", 1)], {}, "cpu")
    with pytest.raises(InvalidDelete, match="time"):
        validate_against_schema([I("ts", 1)], {"ts": ("time", "time")}, "cpu")


# --------------------------------------------------------------------------- Spark SQL

def test_term_to_sql_strings():
    assert term_to_sql(S("host", "x"), quote) == "coalesce(`host` = 'x', false)"
    assert term_to_sql(S("host", "x", "!="), quote) == "coalesce(`host` <> 'x', false)"
    assert term_to_sql(S("a`b", "it's"), quote) == "coalesce(`a``b` = 'it\\'s', false)"
    assert term_to_sql(S("h", "back\\slash"), quote) == "coalesce(`h` = 'back\\\\slash', false)"
    assert term_to_sql(S("h", "\\'"), quote) == "coalesce(`h` = '\\\\\\'', false)"
    assert term_to_sql(S("h", 'a"b'), quote) == "coalesce(`h` = 'a\"b', false)"
    assert term_to_sql(S("h", "日本 ✓"), quote) == "coalesce(`h` = '日本 ✓', false)"
    assert term_to_sql(S("h", ""), quote) == "coalesce(`h` = '', false)"


def test_term_to_sql_numbers_and_booleans():
    assert term_to_sql(I("c", -5), quote) == "coalesce(`c` = -5, false)"
    assert term_to_sql(I("c", 5), quote, "integer") == "coalesce(`c` = 5, false)"
    assert term_to_sql(I("b", 5), quote, "uinteger") == "coalesce(`b` = CAST(5 AS DECIMAL(20,0)), false)"
    assert (term_to_sql(I("b", U64_MAX, "!="), quote, "uinteger")
            == f"coalesce(`b` <> CAST({U64_MAX} AS DECIMAL(20,0)), false)")
    assert term_to_sql(F("u", 0.1), quote, "float") == "coalesce(`u` = 0.1D, false)"
    assert term_to_sql(F("u", 1e16), quote) == "coalesce(`u` = 1e+16D, false)"
    assert term_to_sql(F("u", -2.5), quote) == "coalesce(`u` = -2.5D, false)"
    assert term_to_sql(I("u", 2), quote, "float") == "coalesce(`u` = 2, false)"
    assert term_to_sql(B("ok", True), quote) == "coalesce(`ok` = true, false)"
    assert term_to_sql(B("ok", False, "!="), quote) == "coalesce(`ok` <> false, false)"


def test_term_to_sql_float_is_exact():
    for v in [0.1, 1 / 3, 2.0 ** -1074, 1.7976931348623157e308, -123456.789e-10]:
        sql = term_to_sql(F("u", v), quote)
        lit = sql[len("coalesce(`u` = "):-len("D, false)")]
        assert float(lit) == v


def test_term_to_sql_uses_given_quote_ident():
    assert term_to_sql(S("h", "x"), lambda n: f"[{n}]") == "coalesce([h] = 'x', false)"


def test_predicate_sql():
    assert predicate_sql([], quote, {}) == "true"
    assert predicate_sql([], quote) == "true"
    terms = parse_predicate("host = 'a' AND bytes != 3 AND usage = 1.5")
    assert predicate_sql(terms, quote, {"host": "string", "bytes": "uinteger", "usage": "float"}) == (
        "coalesce(`host` = 'a', false) AND "
        "coalesce(`bytes` <> CAST(3 AS DECIMAL(20,0)), false) AND "
        "coalesce(`usage` = 1.5D, false)")


# --------------------------------------------------------------------------- JSON

def test_json_round_trip_fixed():
    terms = [S("host", "a"), I("c", -3, "!="), F("u", 0.5), B("ok", False), I("b", U64_MAX)]
    data = to_json(terms)
    assert data == [["host", "=", "a", "string"], ["c", "!=", -3, "integer"], ["u", "=", 0.5, "float"],
                    ["ok", "=", False, "boolean"], ["b", "=", U64_MAX, "integer"]]
    assert from_json(json.loads(json.dumps(data))) == terms
    assert to_json([]) == [] and from_json([]) == []


def test_from_json_coerces_integral_float_and_rejects_garbage():
    assert from_json([["u", "=", 2, "float"]]) == [F("u", 2.0)]
    for bad in [None, "x", {"a": 1}, [["a", "=", "x"]], [["a", "<", "x", "string"]],
                [["a", "=", 1, "string"]], [["", "=", "x", "string"]], [["a", "=", 1, "boolean"]],
                [["a", "=", True, "integer"]], [["a", "=", "x", "regex"]], [5]]:
        with pytest.raises(InvalidDelete) as ei:
            from_json(bad)
        assert ei.value.field == "predicate"


# --------------------------------------------------------------------------- hypothesis

columns = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-]{0,12}", fullmatch=True),
    st.text(min_size=1, max_size=12),
    st.sampled_from(["and", "OR", "true", "Null", "not", "a`b", "``", "`", "time zone"]),
)
values = st.one_of(
    st.builds(lambda c, o, v: Term(c, o, v, "string"), columns, st.sampled_from(dp.OPS), st.text(max_size=20)),
    st.builds(lambda c, o, v: Term(c, o, v, "integer"), columns, st.sampled_from(dp.OPS),
              st.integers(I64_MIN, U64_MAX)),
    st.builds(lambda c, o, v: Term(c, o, v, "float"), columns, st.sampled_from(dp.OPS),
              st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(lambda c, o, v: Term(c, o, v, "boolean"), columns, st.sampled_from(dp.OPS), st.booleans()),
)
term_lists = st.lists(values, max_size=6)


def _same(a: list, b: list) -> bool:
    # Term equality plus exact float identity (sign of zero included).
    if a != b:
        return False
    for x, y in zip(a, b):
        if x.kind == "float" and math.copysign(1.0, x.value) != math.copysign(1.0, y.value):
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(term_lists)
def test_render_parse_round_trip(terms):
    text = render_predicate(terms)
    assert _same(parse_predicate(text), terms), text


@settings(max_examples=200, deadline=None)
@given(term_lists)
def test_json_round_trip(terms):
    assert _same(from_json(json.loads(json.dumps(to_json(terms)))), terms)


@settings(max_examples=200, deadline=None)
@given(term_lists, st.sampled_from([" and ", " AND ", "  And\t", " AND\n"]))
def test_render_parse_round_trip_and_spelling(terms, joiner):
    text = joiner.join(render_predicate([t]) for t in terms)
    assert _same(parse_predicate(text), terms), text


@settings(max_examples=500, deadline=None)
@given(st.one_of(
    st.text(max_size=40),
    st.text(alphabet="ab`'\"\\=!<>()- .1e AND OR true", max_size=40),
))
def test_arbitrary_text_parses_completely_or_is_rejected(text):
    try:
        terms = parse_predicate(text)
    except InvalidDelete as e:
        assert e.field == "predicate" and e.reason
        return
    # Accepted: the canonical rendering parses back to the same terms.
    assert _same(parse_predicate(render_predicate(terms)), terms)


@settings(max_examples=300, deadline=None)
@given(st.integers(I64_MIN, I64_MAX))
def test_parse_time_integer_and_rfc3339_agree(ns):
    assert parse_time(str(ns)) == ns
    secs, frac = divmod(ns, NS)
    import datetime as dt
    d = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=secs)
    text = d.strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"
    if d.year >= 1000:
        assert parse_time(text) == ns


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_parse_time_garbage_never_crashes(text):
    try:
        v = parse_time(text, "start")
    except InvalidDelete as e:
        assert e.field == "start"
    else:
        assert I64_MIN <= v <= I64_MAX
