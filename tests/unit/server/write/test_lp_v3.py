"""server/write/lp_v3.py and line_protocol.numbered_lines: InfluxDB 3's precision names and its
`auto` guess, the lines a partial write leaves out, and InfluxDB 3's words for a type conflict."""
from __future__ import annotations

import pyarrow as pa
import pytest

from iox_spark.server.write.line_protocol import numbered_lines, parse_lines
from iox_spark.server.write.lp_v3 import (blank_lines, guess_units, line_text, parse_precision, type_conflict_message)


def test_precision_names():
    assert [parse_precision(p) for p in ("auto", None, "", "nanosecond", "microsecond", "millisecond", "second",
                                          "ns", "us", "ms", "s", "Second")] == \
        [None, None, None, "ns", "us", "ms", "s", "ns", "us", "ms", "s", "s"]
    with pytest.raises(ValueError, match="precision must be one of auto"):
        parse_precision("minute")


def test_auto_guesses_each_timestamps_unit_by_its_magnitude():
    s, ms, us, ns = 1_708_976_567, 1_708_976_567_123, 1_708_976_567_123_456, 1_708_976_567_123_456_789
    raw = pa.array([s, ms, us, ns, -s, 0, 4_999_999_999, 5_000_000_000, 4_999_999_999_999_999], pa.int64())
    assert guess_units(raw).to_pylist() == [
        s * 10**9, ms * 10**6, us * 10**3, ns, -s * 10**9, 0,
        4_999_999_999 * 10**9,  # |t| / 1e9 = 4: seconds
        5_000_000_000 * 10**6,  # 5: milliseconds
        4_999_999_999_999_999 * 10**3]  # 4,999,999: microseconds


def test_numbered_lines_count_as_the_parser_does_and_blanking_keeps_the_others():
    body = (b"# a comment\n"
            b"m v=1 1\n"
            b"\n"
            b"m v=\"two\nlines\" 2\r\n"  # a quoted newline does not end the line
            b"bad line\n"
            b"m v=3 3")
    lines = numbered_lines(body)
    assert [n for n, _a, _b in lines] == [1, 2, 3, 4]
    assert [line_text(body, a, b) for _n, a, b in lines] == ["m v=1 1", 'm v="two\nlines" 2', "bad line", "m v=3 3"]
    errors = parse_lines(body, "ns", 0).errors
    assert [(e.line_number, line_text(body, *[(a, b) for n, a, b in lines if n == e.line_number][0]))
            for e in errors] == [(2, 'm v="two\nlines" 2'), (3, "bad line")]  # v: float, then a string
    kept = blank_lines(body, [(a, b) for n, a, b in lines if n in (2, 3)])
    res = parse_lines(kept, "ns", 0)
    assert res.errors == [] and res.tables["m"].data.column("v").to_pylist() == [1.0, 3.0]
    assert [line_text(kept, a, b) for _n, a, b in numbered_lines(kept)] == ["m v=1 1", "m v=3 3"]


def test_a_type_conflict_in_influxdb_3s_words():
    assert type_conflict_message("temp", ("field", "float"), ("field", "string")) == \
        "invalid column type for column 'temp', expected iox::column_type::field::float, " \
        "got iox::column_type::field::string"
    assert type_conflict_message("host", ("tag", "string"), ("field", "integer")) == \
        "invalid column type for column 'host', expected iox::column_type::tag, got iox::column_type::field::integer"
