"""server/query/pushdown.py with Spark's own parser: what a query reads of a table another pool member
owns. For each query, the answer over the older versions of rows (persisted files) merged with only
the owner's rows and fields that the scan keeps is exactly the answer over every row the owner holds,
and the scans of the queries below do leave rows or fields out (the check is not vacuous)."""
from __future__ import annotations

import pytest

from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN, Column, TableSchema
from iox_spark.chunk_store.views import ChunkSource, table_view_sql
from iox_spark.server.pool.rows import scanned
from iox_spark.server.query.pushdown import TableScan, owner_columns, scans
from iox_spark.server.query.sql_sandbox import check_query
from tests.timestamps import S, T0

SCHEMA = TableSchema("m", [Column("host", "tag", "string"), Column("region", "tag", "string"),
                           Column("v", "field", "float"), Column("w", "field", "integer"),
                           Column("s", "field", "string"), Column("time", "time", "time")])
HOSTS = ["a", "b", "c", "it's", "back\\slash"]


def _rows(seq0: int, versions: int, v_of) -> list:
    """Rows of every host and both regions at T0 + i s (i < 6); field v from v_of(i, host)."""
    out, seq = [], seq0
    for i in range(6):
        for h, host in enumerate(HOSTS):
            region = "eu" if (i + h) % 2 else "us"
            seq += 1
            out.append((host, region, v_of(i, h), i * 10 + h + versions, f"s{i}{h}", T0 + i * S + h, seq))
    return out


COLS = ["host", "region", "v", "w", "s", TIME_NS_COLUMN, SEQ_COLUMN]
# persisted (older) versions of every key, and the owner's newer versions: v changes, so a condition
# on v decided before the merge would pick the wrong version
FILES = _rows(0, 0, lambda i, h: float(i + h))
OWNER = _rows(1_000, 1, lambda i, h: float(10 - i - h))

QUERIES = {
    # time range and a tag list pushed; v not (a field); only v of the fields travels
    "range": ("SELECT host, v, time FROM m WHERE time >= TIMESTAMP '2023-11-14 22:13:22' AND host IN ('a', 'b') "
              "AND v > 1 ORDER BY host, time", True, True),
    # an aggregate with a condition on a field (not pushed) and one on a tag (pushed)
    "aggregate": ("SELECT count(*) AS n, sum(v) AS sv FROM m WHERE v > 2 AND region = 'eu'", True, True),
    # an OR over key columns is one condition
    "or": ("SELECT * FROM m WHERE host = 'c' OR time_ns < 1700000000000000003 ORDER BY time_ns, host",
           True, False),
    # a subquery's WHERE, a star above it: rows filtered, every field
    "subquery": ("SELECT host, max(w) AS mw FROM (SELECT * FROM m WHERE host <> 'a') GROUP BY host ORDER BY host",
                 True, False),
    # two places, each with its condition: their OR
    "union": ("SELECT v FROM m WHERE host = 'a' UNION ALL SELECT v FROM m WHERE region = 'us'", True, True),
    # a clock in the condition does not travel; the tag beside it does
    "clock": ("SELECT host, v FROM m WHERE time > current_timestamp() - INTERVAL 100000 DAYS AND host = 'b' "
              "ORDER BY v", True, True),
    # quotes and backslashes in literals
    "quotes": ("SELECT v, time FROM m WHERE host = 'it''s' OR host = 'back\\\\slash' ORDER BY v, time", True, True),
    # NOT, IS NOT NULL, a date, BETWEEN
    "not": ("SELECT host, time, w FROM m WHERE NOT (host = 'a') AND time_ns IS NOT NULL AND time < DATE '2030-01-01' "
            "AND time BETWEEN '2023-11-14 22:13:21' AND '2023-11-14 22:13:23' ORDER BY host, time", True, True),
    # a self-join, a condition above the join: nothing pushed, every row and field
    "join": ("SELECT a.host, a.v, b.w FROM m a JOIN m b ON a.host = b.host AND a.time = b.time "
             "WHERE a.region = 'eu' ORDER BY a.host, a.time", False, False),
    # a correlated subquery: the outer reference stays; fields pruned to the names spelled
    "exists": ("SELECT s FROM m WHERE EXISTS (SELECT 1 FROM m x WHERE x.host = m.host AND x.v > 3) ORDER BY s",
               False, True),
    # the table read whole (TABLE m): nothing left out
    "table": ("TABLE m", False, False),
}


@pytest.fixture(scope="module")
def spark(iox_server):
    return iox_server.spark.newSession()


def _merged(spark, owner_df, name: str):
    """The table view `name` over FILES and the owner's rows `owner_df` (chunk layout)."""
    files = spark.createDataFrame(FILES, COLS)
    files.createOrReplaceTempView(f"{name}_files")
    owner_df.createOrReplaceTempView(f"{name}_owner")
    lo, hi = T0, T0 + 6 * S
    sql = table_view_sql(SCHEMA, [ChunkSource(f"{name}_files", set(COLS), lo, hi),
                                  ChunkSource(f"{name}_owner", set(owner_df.columns), lo, hi)])
    spark.sql(sql).createOrReplaceTempView(name)


def _answer(spark, sql: str, owner_df) -> list:
    _merged(spark, owner_df, "m")
    return [tuple(r) for r in spark.sql(sql).collect()]


@pytest.mark.parametrize("case", sorted(QUERIES))
def test_an_owner_sends_what_the_query_reads_and_the_answer_is_the_same(spark, case):
    sql, filters, prunes = QUERIES[case]
    tree = check_query(spark.newSession(), "d", sql).tree
    assert tree is not None
    scan = scans(tree, {"m": SCHEMA}, sql).get("m")
    assert bool(scan and scan.where_sql) == filters, scan
    assert bool(scan and scan.prune_fields) == prunes, scan
    owner = spark.createDataFrame(OWNER, COLS)
    kept = scanned(owner, SCHEMA, scan)
    if filters:
        assert 0 < kept.count() < len(OWNER)
    if prunes:
        assert set(kept.columns) < set(COLS) and {"host", "region", TIME_NS_COLUMN, SEQ_COLUMN} <= set(kept.columns)
    expected = _answer(spark, sql, owner)
    assert expected  # every query here answers rows
    assert _answer(spark, sql, kept) == expected


def test_retention_leaves_the_older_rows_at_the_owner(spark):
    owner = spark.createDataFrame(OWNER, COLS)
    kept = scanned(owner, SCHEMA, None, reader_lo_ns=T0 + 3 * S)
    assert sorted(r[TIME_NS_COLUMN] for r in kept.collect()) == sorted(r[5] for r in OWNER if r[5] >= T0 + 3 * S)


def test_a_cte_of_the_tables_name_and_unknown_names_push_nothing(spark):
    for sql in ("WITH m AS (SELECT 1 AS v) SELECT v FROM m",
                "SELECT v FROM m WHERE nosuch = 'x' AND v > 1"):
        tree = check_query(spark.newSession(), "d", sql).tree
        got = scans(tree, {"m": SCHEMA}, sql).get("m")
        assert got is None or not got.where_sql, (sql, got)
    # a field the asking member does not know yet, named by the query, still travels
    sql = "SELECT newfield FROM m WHERE host = 'a'"
    scan = scans(check_query(spark.newSession(), "d", sql).tree, {"m": SCHEMA}, sql)["m"]
    wider = TableSchema("m", SCHEMA.columns + [Column("newfield", "field", "float")])
    assert scan.where_sql == "(`host` = 'a')"
    assert owner_columns(wider, scan) == ["host", "region", "newfield", TIME_NS_COLUMN, SEQ_COLUMN]
    assert owner_columns(wider, TableScan("m")) == ["host", "region", "newfield", "s", "v", "w", TIME_NS_COLUMN,
                                                    SEQ_COLUMN]
