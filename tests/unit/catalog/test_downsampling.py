"""catalog/downsampling.py and `Database.downsample_changes`: a downsampler's definition, its stored
record, the windows a change touches, and what a source database says changed since a progress."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.downsampling import (Aggregate, DownsamplerSpec, InvalidDownsampler, Progress, aggregate_sql,
                                            changed_spans, decode_record, encode_record, output_columns,
                                            parse_aggregates, parse_group_by, resume_from, window_ranges,
                                            window_start)
from iox_spark.catalog.errors import FormatVersionMismatch
from iox_spark.catalog.seq_layout import seq_base
from iox_spark.catalog.sharding import partition_for

S = 10**9


def _spec(**kw) -> DownsamplerSpec:
    base = dict(source_db="src", table="cpu", every_ns=60 * S, aggregates=parse_aggregates("mean(usage),count(usage)"),
                group_by=None, dest_db="dst", dest_table="cpu_1m", start_ns=0)
    base.update(kw)
    return DownsamplerSpec(**base)


def test_aggregates_parse_and_name_their_fields():
    aggs = parse_aggregates(" mean(usage), MAX( usage ),count(`user load`)")
    assert aggs == (Aggregate("mean", "usage"), Aggregate("max", "usage"), Aggregate("count", "user load"))
    assert [a.output for a in aggs] == ["mean_usage", "max_usage", "count_user load"]
    for bad, says in [("", "none given"), ("median(x)", "median"), ("mean", "fn(field)"), ("mean(a(b))", "fn(field)")]:
        with pytest.raises(InvalidDownsampler, match=says.replace("(", r"\(").replace(")", r"\)")):
            parse_aggregates(bad)
    assert parse_group_by("all") is None and parse_group_by("") is None
    assert parse_group_by("host, region") == ("host", "region")


def test_a_spec_is_validated_and_named_after_its_destination():
    assert _spec().name == "dst.cpu_1m"
    _spec().validate()
    for kw, says in [(dict(every_ns=S // 2), "every"), (dict(every_ns=1500 * 10**6), "every"),
                     (dict(dest_db="src", dest_table="cpu"), "source table itself"),
                     (dict(dest_db="a b"), "destination database"),
                     (dict(aggregates=parse_aggregates("max(x),max(x)")), "twice"),
                     (dict(group_by=("h", "h")), "twice")]:
        with pytest.raises(InvalidDownsampler, match=says):
            _spec(**kw).validate()


def test_output_columns_are_the_group_tags_then_one_typed_field_per_aggregate():
    source = {"host": ("tag", "string"), "dc": ("tag", "string"), "usage": ("field", "integer"),
              "up": ("field", "boolean"), "time": ("time", "time")}
    spec = _spec(aggregates=parse_aggregates("mean(usage),sum(usage),max(usage),count(up),last(up)"))
    assert output_columns(spec, source) == [
        ("host", "tag", "string"), ("dc", "tag", "string"), ("mean_usage", "field", "float"),
        ("sum_usage", "field", "integer"), ("max_usage", "field", "integer"), ("count_up", "field", "integer"),
        ("last_up", "field", "boolean")]
    assert output_columns(_spec(group_by=("dc",)), source)[0] == ("dc", "tag", "string")
    for spec, says in [(_spec(aggregates=parse_aggregates("mean(up)")), "numeric"),
                       (_spec(aggregates=parse_aggregates("mean(host)")), "not a field"),
                       (_spec(group_by=("usage",)), "not a tag")]:
        with pytest.raises(InvalidDownsampler, match=says):
            output_columns(spec, source)


def test_windows_are_aligned_to_the_epoch_also_before_it():
    assert window_start(125 * S, 60 * S) == 120 * S
    assert window_start(-1, 60 * S) == -60 * S
    assert window_start(120 * S, 60 * S) == 120 * S


def test_window_ranges_cover_whole_windows_from_the_start_joined_where_they_touch():
    every = 10
    assert window_ranges([(3, 3)], every, 0) == [(0, 10)]
    assert window_ranges([(3, 12), (25, 29), (30, 30)], every, 0) == [(0, 40)]
    assert window_ranges([(3, 12), (35, 36)], every, 0) == [(0, 20), (30, 40)]
    assert window_ranges([(3, 12), (35, 36)], every, 31) == [(30, 40)]  # from the start's window on
    assert window_ranges([(3, 5)], every, 40) == []
    # more ranges than the limit: joined across the smallest gaps, still a cover
    got = window_ranges([(0, 0), (20, 20), (100, 100), (110, 110)], every, 0, limit=2)
    assert got == [(0, 30), (100, 120)]


def test_aggregate_sql_groups_by_tags_and_window_within_the_ranges():
    spec = _spec(aggregates=parse_aggregates("mean(usage),first(usage)"))
    sql = aggregate_sql(spec, ["host"], [(0, 60 * S), (120 * S, 180 * S)])
    assert sql.startswith("SELECT `host`, (`time_ns` - pmod(`time_ns`, 60000000000)) AS `_window_ns`, avg(`usage`) "
                          "AS `mean_usage`, min_by(`usage`, CASE WHEN `usage` IS NOT NULL THEN `time_ns` END) AS "
                          "`first_usage` FROM `cpu` WHERE ")
    assert "(`time_ns` >= 0 AND `time_ns` < 60000000000) OR (`time_ns` >= 120000000000 AND `time_ns` < " \
           "180000000000)" in sql
    assert sql.endswith("GROUP BY `host`, (`time_ns` - pmod(`time_ns`, 60000000000))")


def test_a_record_round_trips_and_another_format_is_refused():
    spec = _spec(group_by=("host",), start_ns=-5)
    assert decode_record(encode_record(spec, None), "k") == (spec, None)
    p = Progress(2, 1 << 40, {0: 5, 3: 9})
    assert decode_record(encode_record(spec, p), "k") == (spec, p)
    bad = encode_record(spec, p).replace(b'"format": 1', b'"format": 2')
    with pytest.raises(FormatVersionMismatch):
        decode_record(bad, "iox~downsamplers/dst.cpu_1m.json")
    with_dest = Progress(2, 1 << 40, {0: 5}, dest_epoch=(3, "tid"))
    assert decode_record(encode_record(spec, with_dest), "k") == (spec, with_dest)
    # a record of an earlier version names no destination epoch
    old = b'{"format": 1, "progress": {"epoch": 2, "next_offsets": {"0": 5}, "seq_origin": 7}, "spec": ' + \
        json.dumps(spec.to_json()).encode() + b'}'
    assert decode_record(old, "k") == (spec, Progress(2, 7, {0: 5}))


def test_a_destination_in_another_write_buffer_epoch_or_gone_makes_every_window_emitted_again():
    p = Progress(0, 0, {0: 5}, dest_epoch=(1, "t1"))
    assert resume_from(p, (1, "t1")) is p
    assert resume_from(p, (2, "t1")) is None  # its broker lost the tail, the loss accepted
    assert resume_from(p, (1, "t2")) is None  # its topic deleted and created again
    assert resume_from(p, None) is None  # the destination database is gone
    unknown = Progress(0, 0, {0: 5})  # recorded before the destination's epoch was kept
    assert resume_from(unknown, (4, "t")) is unknown and resume_from(unknown, None) is unknown
    assert resume_from(None, (1, "t1")) is None


def test_changed_spans_take_what_is_at_or_after_the_progress():
    rows, dels = changed_spans([(4, 0, 9), (5, 10, 19)], [(99, 20, 29), (100, 30, 39)], [(99, 40, 50), (100, 50, 60)],
                               since_offset=5, since_seq=100)
    assert rows == ((10, 19), (30, 39)) and dels == ((50, 59),)


def _chunk(cid: int, table: str, kp: int, lo_off: int, hi_off: int, t_lo: int, t_hi: int) -> Chunk:
    return Chunk(id=cid, table=table, partition_key="2023-11-14", order=cid, state="open", rows=1, size_bytes=1,
                 min_time_ns=t_lo, max_time_ns=t_hi, columns=[], view=None, offsets={kp: (lo_off, hi_off)})


def test_a_database_names_the_windows_files_and_deletes_at_or_after_a_progress():
    cat = Catalog()
    db = cat.ensure_database("src", "iox.src", 2)
    kp = partition_for("cpu", 2)
    db.set_epoch(0, 0)
    assert db.downsample_changes("cpu", None).full
    cat.add_chunk(db, _chunk(1, "cpu", kp, 0, 3, 100, 200), now=1.0)
    cat.add_chunk(db, _chunk(2, "cpu", kp, 4, 6, 5000, 5100), now=100.0)  # a window of its own
    cat.advance_applied(db, {kp: 6})
    part = cat.get_partition(db, "cpu", "2023-11-14")
    part.files.append(SimpleNamespace(min_time_ns=10, max_time_ns=20, max_seq=seq_base(0, 2) + 7))
    part.files.append(SimpleNamespace(min_time_ns=30, max_time_ns=40, max_seq=seq_base(0, 5)))
    db.deletes.add(Delete("cpu", 60, 70, (), seq_base(0, 5), kp))
    db.deletes.add(Delete("other", 80, 90, (), seq_base(0, 6), kp))
    first = db.downsample_changes("cpu", None)
    assert first.full and first.applied_next == {kp: 7} and (first.min_time_ns, first.max_time_ns) == (10, 5100)
    assert first.delete_spans == ((60, 69),)
    ch = db.downsample_changes("cpu", Progress(0, 0, {kp: 5}))
    assert not ch.full
    # the persistence windows hold offsets 0-3 and 4-6: only the second reaches offset 5; only the
    # second file holds a seq at or after offset 5's
    assert ch.row_spans == ((5000, 5100), (30, 40))
    assert ch.delete_spans == ((60, 69),)
    assert ch.progress() == Progress(0, 0, {kp: 7})
    # all emitted: nothing changed
    done = db.downsample_changes("cpu", ch.progress())
    assert done.row_spans == () and done.delete_spans == ()
    # progress of another write-buffer epoch: everything again
    assert db.downsample_changes("cpu", Progress(1, 0, {kp: 7})).full
