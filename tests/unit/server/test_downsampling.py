"""server/downsampling.py: a CreateDownsampler request's spec, the slices of a round's queries, and
the line protocol of its output (parsed back by the server's own line protocol parser)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from iox_spark.catalog.downsampling import parse_aggregates
from iox_spark.server.downsampling import Downsamplers, output_lines, query_slices, spec_of_request
from iox_spark.server.errors import InvalidArgument, NotServed
from iox_spark.server.write.line_protocol import parse_lines

S = 10**9
NOW = 1_700_000_000 * S


def test_a_request_becomes_a_spec():
    spec = spec_of_request("src", "cpu", "1m", "mean(usage)", "host", "dst", "", NOW)
    assert (spec.dest_db, spec.dest_table, spec.every_ns, spec.group_by, spec.start_ns) == \
        ("dst", "cpu_1m", 60 * S, ("host",), 0)
    assert spec_of_request("src", "cpu", "3600", "max(u)", "all", "dst.hourly", "30d", NOW).start_ns == NOW - 30 * 86400 * S
    assert spec_of_request("src", "cpu", "1h", "max(u)", "", "dst.h", "2023-11-14T00:00:00Z", NOW).start_ns == \
        1_699_920_000 * S
    assert spec_of_request("src", "cpu", "1h", "max(u)", "", "dst.h", "-5", NOW).start_ns == -5
    for args, says in [(("10x", "mean(u)", "", "d", ""), "every"), (("0", "mean(u)", "", "d", ""), "every"),
                       (("1m", "mean(u)", "", "", ""), "--into"), (("1m", "avg(u)", "", "d", ""), "avg"),
                       (("1m", "mean(u)", "", "d", "soon"), "start"), (("1m", "mean(u)", "", "src.cpu", ""), "itself")]:
        every, aggs, tags, into, start = args
        with pytest.raises(InvalidArgument, match=says):
            spec_of_request("src", "cpu", every, aggs, tags, into, start, NOW)


def test_slices_cut_long_ranges_and_keep_short_ones_together():
    assert query_slices([(0, 10), (20, 30)], 100) == [[(0, 10), (20, 30)]]
    assert query_slices([(0, 250)], 100) == [[(0, 100)], [(100, 200)], [(200, 250)]]
    assert query_slices([(0, 60), (100, 160)], 100) == [[(0, 60), (100, 140)], [(140, 160)]]
    assert query_slices([], 100) == []


def test_output_lines_escape_names_and_leave_out_nulls_and_non_finite_values():
    spec = spec_of_request("src", "cpu", "1m", "mean(u),max(u),count(u),last(s),first(b)", "all", "dst.cpu 1m,x", "", NOW)
    columns = [("host", "tag", "string"), ("dc", "tag", "string"), ("mean_u", "field", "float"),
               ("max_u", "field", "integer"), ("count_u", "field", "integer"), ("last_s", "field", "string"),
               ("first_b", "field", "boolean")]
    rows = pa.table({"host": ["a b", "c,=d", None], "dc": ["x", None, None], "_window_ns": [0, 60 * S, 120 * S],
                     "mean_u": [1.5, float("nan"), None], "max_u": [3, 4, None], "count_u": [2, 1, 0],
                     "last_s": ['say "hi"\\', None, None], "first_b": [True, False, None]})
    lines = output_lines(spec, columns, rows)
    assert lines == [b'cpu\\ 1m\\,x,dc=x,host=a\\ b mean_u=1.5,max_u=3i,count_u=2i,last_s="say \\"hi\\"\\\\",first_b=true 0',
                     b"cpu\\ 1m\\,x,host=c\\,\\=d max_u=4i,count_u=1i,first_b=false 60000000000",
                     b"cpu\\ 1m\\,x count_u=0i 120000000000"]
    parsed = parse_lines(b"\n".join(lines), "ns", NOW)
    assert not parsed.errors and parsed.lines == 3 and list(parsed.tables) == ["cpu 1m,x"]
    assert parse_aggregates("mean(u)")[0].output == "mean_u"


def test_a_pool_member_refuses_to_create_one():
    ds = Downsamplers(catalog=None, store=None, queries=None, read_barrier=None, router=None, write_buffer=None,
                      late_arrive_window_s=300, pool_member=True)
    with pytest.raises(NotServed, match="pool"):
        ds.create("src", "cpu", "1m", "mean(u)", "all", "dst", "")
