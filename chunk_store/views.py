"""SQL views over chunks: what a query of a table sees.

Invariant: a table view is exactly (every chunk of the table, memory or Parquet)
deduplicated on (tags, time): each field takes its last non-null value in
write-buffer order (`_iox_seq`). Chunk views are never changed in place; a
table view is replaced atomically (CREATE OR REPLACE), so a query already
planned keeps the chunks it resolved.

Deduplication is planned only where it can change a row (IOx: only overlapping
chunks are deduplicated): chunks are split into groups whose time spans meet
(catalog/time_spans.py: each chunk's rows lie in its spans, finer than its
[min, max] hull); a group of one chunk that is already deduplicated
(compaction and persist output, Parquet files, write-buffer chunks of
unique-keyed requests apart in time) is read as it is, every other group is
merged with GROUP BY (tags, time), or read from a relation the caller supplies
holding the group's merge (`merged_relation`: the ingestor's table views use
one Arrow task over the write-buffer form for large groups,
chunk_store/chunk_data.py `arrow_merge_relations`). Two groups never share a
(tags, time) key, since their spans are disjoint.

Naming: chunk data `iox_chunk_<id>`, a temp view of the server's session (chunk_store/chunk_views.py);
table view `global_temp.<database>__<table>` (backtick-quoted when needed; stable, documented in
the README).
"""
from __future__ import annotations

from typing import NamedTuple

from iox_spark.catalog import time_spans
from iox_spark.catalog.schema import SEQ_COLUMN, SPARK_TYPES, TIME_NS_COLUMN, TableSchema

__all__ = ["ChunkSource", "deletes_sql", "quote", "table_view_name", "chunk_view_name", "chunk_select_sql",
           "empty_table_view_sql", "overlap_groups", "table_view_sql", "spark_struct_for", "retained_view_sql"]


class ChunkSource(NamedTuple):
    """One chunk as a view reads it."""

    #: SQL naming the chunk's rows (a global temp view)
    sql: str
    #: the columns the chunk holds
    columns: set
    #: inclusive time range of its rows
    min_time_ns: int
    max_time_ns: int
    #: no two rows of the chunk share (tags, time): it needs no GROUP BY of its own
    deduplicated: bool = False
    #: where in time its rows lie (catalog/time_spans.py); () = [min_time_ns, max_time_ns]
    time_spans: tuple = ()


def overlap_groups(sources: list) -> list:
    """`sources` split into groups of chunks whose time spans meet (transitively), ordered by
    their earliest time; within a group the input order is kept. A chunk without rows (no time
    range) is a group of its own, last. Pure."""
    flat = sorted((lo, hi, i) for i, s in enumerate(sources) for lo, hi in time_spans.of_chunk(s))
    parent = list(range(len(sources)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # a sweep over all spans by start: a span meeting the run so far joins its chunk to the run's
    run_hi, run_chunk = None, None
    for lo, hi, i in flat:
        if run_hi is not None and lo <= run_hi:
            parent[root(i)] = root(run_chunk)
            run_hi = max(run_hi, hi)
        else:
            run_hi, run_chunk = hi, i
    groups: dict = {}
    first: dict = {}
    for lo, _hi, i in flat:
        first.setdefault(root(i), lo)
    for i, s in enumerate(sources):
        if s.min_time_ns is not None:
            groups.setdefault(root(i), []).append(s)
    empty = [[s] for s in sources if s.min_time_ns is None]
    return [groups[r] for r in sorted(groups, key=lambda r: (first[r], r))] + empty


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_view_name(database: str, table: str) -> str:
    return f"{database}__{table}"


def retained_view_sql(view_sql: str, period_s: int | None) -> str:
    """`view_sql` without the rows older than a retention of `period_s` seconds (None or 0: all of
    them), judged by the clock when the view is read (Spark's `current_timestamp()`, one value per
    query), as every query path judges it (catalog/retention.py `reader_lo_ns`)."""
    if not period_s:
        return view_sql
    return (f"SELECT * FROM ({view_sql}) WHERE {quote(TIME_NS_COLUMN)} >= "
            f"unix_micros(current_timestamp()) * 1000 - {int(period_s) * 1_000_000_000}")


def chunk_view_name(chunk_id: int) -> str:
    return f"iox_chunk_{chunk_id}"


def _value_columns(schema: TableSchema) -> list:
    return [c for c in schema.columns if c.role != "time"]


def chunk_select_sql(source_sql: str, chunk_columns: set, schema: TableSchema) -> str:
    """Projects one chunk onto the table's full schema (columns it lacks read as NULL)."""
    parts = []
    for c in _value_columns(schema):
        if c.name in chunk_columns:
            parts.append(quote(c.name))
        else:
            parts.append(f"CAST(NULL AS {SPARK_TYPES[c.type]}) AS {quote(c.name)}")
    parts += [quote(TIME_NS_COLUMN), quote(SEQ_COLUMN)]
    return f"SELECT {', '.join(parts)} FROM {source_sql}"


def deletes_sql(schema: TableSchema, deletes: list) -> str:
    """SQL condition that is true for rows NO delete removes (before dedup, per row)."""
    if not deletes:
        return ""
    from iox_spark.catalog.delete_predicate import from_json, predicate_sql

    col_types = {c.name: c.type for c in schema.columns}
    t, s = quote(TIME_NS_COLUMN), quote(SEQ_COLUMN)
    conds = []
    for d in deletes:
        if any(term[0] not in col_types for term in d.predicate):
            continue  # a column the table lacks is NULL: `=` and `!=` never match, nothing to delete
        pred = predicate_sql(from_json([list(x) for x in d.predicate]), quote, col_types)
        conds.append(f"({s} < {d.seq} AND {t} >= {d.start_ns} AND {t} < {d.stop_ns_exclusive} AND {pred})")
    return "NOT (" + " OR ".join(conds) + ")"


def table_view_sql(schema: TableSchema, chunk_sources: list, as_chunk: bool = False, deletes: list = (),
                   merged_relation=None) -> str:
    """The deduplicating view over `chunk_sources` (a list of ChunkSource).

    as_chunk=False: what users query (tags, fields, `time` TIMESTAMP, `time_ns`).
    as_chunk=True: the chunk layout (tags, fields, `time_ns`, `_iox_seq` = the
    newest write merged into the row), used by compaction and persist so a
    merged chunk orders exactly like the chunks it replaces.
    Only groups of overlapping chunks are merged (see the module docstring).
    `merged_relation(group)`: optional, a ChunkSource holding the group's merge with `deletes`
    already applied (read as it is), or None to merge the group here with GROUP BY.
    """
    where = deletes_sql(schema, list(deletes))
    where = f" WHERE {where}" if where else ""
    parts = []
    for group in overlap_groups(list(chunk_sources)):
        if len(group) == 1 and group[0].deduplicated:
            parts.append(_plain_sql(schema, group[0], as_chunk, where))
        elif merged_relation is not None and (rel := merged_relation(group)) is not None:
            parts.append(_plain_sql(schema, rel, as_chunk, ""))
        else:
            parts.append(_merge_sql(schema, group, as_chunk, where))
    return "\nUNION ALL\n".join(parts)


def empty_table_view_sql(schema: TableSchema) -> str:
    """A table with columns (its schema known, e.g. reserved by a request that was then aborted)
    but no rows yet: the user layout of `table_view_sql`, without a row."""
    sel = [f"CAST(NULL AS STRING) AS {quote(c)}" for c in schema.tags()]
    sel += [f"CAST(NULL AS {SPARK_TYPES[f.type]}) AS {quote(f.name)}" for f in schema.fields()]
    sel += ["CAST(NULL AS TIMESTAMP) AS `time`", f"CAST(NULL AS BIGINT) AS {quote(TIME_NS_COLUMN)}"]
    return f"SELECT {', '.join(sel)} WHERE false"


def _time_columns(as_chunk: bool) -> list:
    t, s = quote(TIME_NS_COLUMN), quote(SEQ_COLUMN)
    if as_chunk:
        return [t, s]
    # exact floor division: time is TIMESTAMP (microseconds), time_ns keeps every digit
    return [f"timestamp_micros(({t} - pmod({t}, 1000)) DIV 1000) AS `time`", t]


def _plain_sql(schema: TableSchema, src: ChunkSource, as_chunk: bool, where: str) -> str:
    """One deduplicated chunk read as it is, in the merged layout."""
    sel = [quote(c) for c in schema.tags()] + [quote(f.name) for f in schema.fields()] + _time_columns(as_chunk)
    return f"SELECT {', '.join(sel)} FROM (\n{chunk_select_sql(src.sql, src.columns, schema)}\n){where}"


def _merge_sql(schema: TableSchema, group: list, as_chunk: bool, where: str) -> str:
    """Overlapping chunks merged on (tags, time): the last non-null value per field by `_iox_seq`."""
    union = "\nUNION ALL\n".join(chunk_select_sql(src.sql, src.columns, schema) for src in group)
    tags = [quote(t) for t in schema.tags()]
    t, s = quote(TIME_NS_COLUMN), quote(SEQ_COLUMN)
    sel = list(tags)
    for f in schema.fields():
        q = quote(f.name)
        sel.append(f"max_by({q}, CASE WHEN {q} IS NOT NULL THEN {s} END) AS {q}")
    if as_chunk:
        sel += [t, f"max({s}) AS {s}"]
    else:
        sel += _time_columns(False)
    group_by = ", ".join(tags + [t])
    return f"SELECT {', '.join(sel)} FROM (\n{union}\n){where} GROUP BY {group_by}"


def spark_struct_for(schema: TableSchema):
    """Spark StructType of a chunk holding `schema`'s columns (plus time_ns and _iox_seq)."""
    from pyspark.sql import types as T

    def _t(typ: str):
        return {"string": T.StringType(), "float": T.DoubleType(), "integer": T.LongType(),
                "uinteger": T.DecimalType(20, 0), "boolean": T.BooleanType()}[typ]

    fields = [T.StructField(c.name, _t(c.type), True) for c in _value_columns(schema)]
    fields += [T.StructField(TIME_NS_COLUMN, T.LongType(), False), T.StructField(SEQ_COLUMN, T.LongType(), False)]
    return T.StructType(fields)
