"""server/query/params.py: placeholders outside strings, identifiers and comments are replaced by
literals; nothing of a value is read as SQL; every placeholder needs a value and every value a
placeholder."""
from __future__ import annotations

import datetime
import decimal

import pytest
from hypothesis import given, strategies as st

from iox_spark.server.errors import InvalidArgument
from iox_spark.server.query.params import bind_parameters, placeholders, sql_literal


def test_positional_placeholders_are_bound_in_order():
    assert bind_parameters("SELECT * FROM t WHERE a = ? AND b > ?", [1, "x"]) == \
        "SELECT * FROM t WHERE a = 1 AND b > 'x'"


def test_named_placeholders_are_bound_by_name_each_time_they_appear():
    assert bind_parameters("SELECT $a, $b, $a", named={"a": 2, "b": None}) == "SELECT 2, NULL, 2"


def test_placeholders_inside_strings_identifiers_and_comments_are_text():
    sql = ("SELECT '?', \"$x\", `a?b`, 'it\\'s ?' -- a ? here\n"
           "/* and ? /* nested ? */ ? */ FROM t WHERE c = ?")
    assert placeholders(sql) == (1, [])
    assert bind_parameters(sql, ["v"]).endswith("WHERE c = 'v'")
    assert bind_parameters(sql, ["v"]).startswith("SELECT '?', \"$x\", `a?b`, 'it\\'s ?' -- a ? here\n")


def test_literals():
    assert sql_literal(True) == "TRUE" and sql_literal(None) == "NULL"
    assert sql_literal(-3) == "(-3)" and sql_literal(7) == "7"
    assert sql_literal(1.5) == "1.5D" and sql_literal(-2.5) == "(-2.5D)"
    assert sql_literal(float("nan")) == "CAST('NaN' AS DOUBLE)"
    assert sql_literal(float("-inf")) == "CAST('-Infinity' AS DOUBLE)"
    assert sql_literal(decimal.Decimal("-1.20")) == "(-1.20BD)"
    assert sql_literal("a'b\\c") == "'a\\'b\\\\c'"
    assert sql_literal(b"\x00\xff") == "X'00ff'"
    assert sql_literal(datetime.date(2024, 2, 3)) == "DATE '2024-02-03'"
    stamp = datetime.datetime(2024, 2, 3, 4, 5, 6, 7, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert sql_literal(stamp) == "TIMESTAMP '2024-02-03 02:05:06.000007'"
    with pytest.raises(InvalidArgument, match="cannot be bound"):
        sql_literal([1, 2])


def test_a_negative_number_after_a_minus_starts_no_comment():
    assert bind_parameters("SELECT 1-?", [-1]) == "SELECT 1-(-1)"


@pytest.mark.parametrize("sql,positional,named,message", [
    ("SELECT ?, ?", [1], None, "more \\? placeholders"),
    ("SELECT ?", [1, 2], None, "2 positional parameter"),
    ("SELECT $a", None, {}, "no value is given for the parameter \\$a"),
    ("SELECT $a", None, {"a": 1, "b": 2}, "\\$b given but not used"),
])
def test_a_placeholder_without_a_value_or_a_value_without_a_placeholder_is_refused(sql, positional, named, message):
    with pytest.raises(InvalidArgument, match=message):
        bind_parameters(sql, positional, named)


@given(st.text())
def test_a_bound_string_reads_back_as_one_string_literal_whatever_it_holds(value):
    """The literal of any string is one quoted token: scanning the bound query finds no placeholder
    in it, and it ends where it started (a quote no escape can end early)."""
    bound = bind_parameters("SELECT ? AS v, ?", [value, 1])
    literal = sql_literal(value)
    assert bound == f"SELECT {literal} AS v, 1"
    assert placeholders(bound + " ?") == (1, [])  # the only placeholder is the one after the literal
