"""Tests of chunk_store/views.py: which chunks a view deduplicates, and the SQL it plans."""
from __future__ import annotations

from iox_spark.catalog.schema import Column, TableSchema
from iox_spark.chunk_store.views import ChunkSource, overlap_groups, table_view_sql

SCHEMA = TableSchema("cpu", [Column("host", "tag", "string"), Column("usage", "field", "float"),
                             Column("time", "time", "integer")])


def src(name: str, lo: int, hi: int, dedup: bool = True) -> ChunkSource:
    return ChunkSource(f"global_temp.{name}", {"host", "usage"}, lo, hi, dedup)


def test_overlap_groups_joins_transitively_overlapping_time_ranges_and_keeps_input_order():
    a, b, c, d = src("a", 0, 10), src("b", 10, 20), src("c", 30, 40), src("d", 15, 29)
    # a-b touch at 10 (inclusive), d overlaps b; c starts after d ends
    assert overlap_groups([c, b, a, d]) == [[b, a, d], [c]]
    assert overlap_groups([src("x", 5, 5), src("y", 6, 9)]) == [[src("x", 5, 5)], [src("y", 6, 9)]]
    assert overlap_groups([]) == []
    empty = ChunkSource("global_temp.e", set(), None, None, True)  # every row deleted by a compaction
    assert overlap_groups([empty, a, b]) == [[a, b], [empty]]


def test_one_deduplicated_chunk_is_read_without_group_by():
    sql = table_view_sql(SCHEMA, [src("a", 0, 10)])
    assert "GROUP BY" not in sql and "max_by" not in sql
    assert "global_temp.a" in sql and "AS `time`" in sql


def test_a_chunk_that_may_hold_duplicates_is_merged_even_alone():
    sql = table_view_sql(SCHEMA, [src("a", 0, 10, dedup=False)])
    assert sql.count("GROUP BY") == 1


def test_only_overlapping_chunks_are_merged_and_deletes_filter_every_group():
    from iox_spark.catalog.delete_mailbox import Delete

    d = Delete(table="cpu", start_ns=0, stop_ns_exclusive=100, predicate=(), seq=7, kafka_partition=0)
    sql = table_view_sql(SCHEMA, [src("a", 0, 10), src("b", 5, 20), src("c", 50, 60)], as_chunk=True,
                         deletes=[d])
    merged, plain = sql.split("\nUNION ALL\nSELECT `host`, `usage`, `time_ns`, `_iox_seq` FROM (")
    assert merged.count("GROUP BY") == 1 and "global_temp.a" in merged and "global_temp.b" in merged
    assert "GROUP BY" not in plain and "global_temp.c" in plain
    assert merged.count("`_iox_seq` < 7") == 1 and plain.count("`_iox_seq` < 7") == 1


def test_a_table_without_rows_is_an_empty_view_in_the_user_layout():
    from iox_spark.chunk_store.views import empty_table_view_sql

    sql = empty_table_view_sql(SCHEMA)
    assert sql == ("SELECT CAST(NULL AS STRING) AS `host`, CAST(NULL AS DOUBLE) AS `usage`, "
                   "CAST(NULL AS TIMESTAMP) AS `time`, CAST(NULL AS BIGINT) AS `time_ns` WHERE false")


def test_chunks_whose_hulls_overlap_but_spans_do_not_are_read_without_group_by():
    # two write-buffer chunks of interleaved requests: hulls [0, 39] and [10, 49], spans apart
    a = ChunkSource("global_temp.a", {"host", "usage"}, 0, 39, True, ((0, 9), (20, 29), (30, 39)))
    b = ChunkSource("global_temp.b", {"host", "usage"}, 10, 49, True, ((10, 19), (40, 49)))
    assert overlap_groups([a, b]) == [[a], [b]]
    assert "GROUP BY" not in table_view_sql(SCHEMA, [a, b])
    # a third chunk meeting a span of each joins both into one merged group, in input order
    c = ChunkSource("global_temp.c", {"host", "usage"}, 29, 40, True, ((29, 29), (40, 40)))
    assert overlap_groups([b, c, a]) == [[b, c, a]]
    assert table_view_sql(SCHEMA, [a, b, c]).count("GROUP BY") == 1
    # a span-less chunk is its hull
    d = src("d", 50, 60)
    assert overlap_groups([d, a]) == [[a], [d]]
