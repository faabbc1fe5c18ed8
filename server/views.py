"""SQL views over chunks: what a query of a table sees.

Invariant: a table view is exactly (every chunk of the table, memory or Parquet)
deduplicated on (tags, time): each field takes its last non-null value in
write-buffer order (`_iox_seq`). Chunk views are never changed in place; a
table view is replaced atomically (CREATE OR REPLACE), so a query already
planned keeps the chunks it resolved.

Naming (stable, documented in the README): chunk data `global_temp.iox_chunk_<id>`;
table view `global_temp.<database>__<table>` (backtick-quoted when needed).
"""
from __future__ import annotations

from catalog.schema import SEQ_COLUMN, SPARK_TYPES, TIME_NS_COLUMN, TableSchema

__all__ = ["deletes_sql", "quote", "table_view_name", "chunk_view_name", "chunk_select_sql", "table_view_sql",
           "spark_struct_for"]


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_view_name(database: str, table: str) -> str:
    return f"{database}__{table}"


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
    from .delete_predicate import from_json, predicate_sql

    col_types = {c.name: c.type for c in schema.columns}
    t, s = quote(TIME_NS_COLUMN), quote(SEQ_COLUMN)
    conds = []
    for d in deletes:
        if any(term[0] not in col_types for term in d.predicate):
            continue  # a column the table lacks is NULL: `=` and `!=` never match, nothing to delete
        pred = predicate_sql(from_json([list(x) for x in d.predicate]), quote, col_types)
        conds.append(f"({s} < {d.seq} AND {t} >= {d.start_ns} AND {t} < {d.stop_ns_exclusive} AND {pred})")
    return "NOT (" + " OR ".join(conds) + ")"


def table_view_sql(schema: TableSchema, chunk_sources: list, as_chunk: bool = False, deletes: list = ()) -> str:
    """The deduplicating view over `chunk_sources`: [(source_sql, chunk_columns)].

    as_chunk=False: what users query (tags, fields, `time` TIMESTAMP, `time_ns`).
    as_chunk=True: the chunk layout (tags, fields, `time_ns`, `_iox_seq` = the
    newest write merged into the row), used by compaction and persist so a
    merged chunk orders exactly like the chunks it replaces.
    """
    union = "\nUNION ALL\n".join(chunk_select_sql(src, cols, schema) for src, cols in chunk_sources)
    tags = [quote(t) for t in schema.tags()]
    fields = schema.fields()
    t = quote(TIME_NS_COLUMN)
    s = quote(SEQ_COLUMN)
    sel = list(tags)
    for f in fields:
        q = quote(f.name)
        sel.append(f"max_by({q}, CASE WHEN {q} IS NOT NULL THEN {s} END) AS {q}")
    # exact floor division: time is TIMESTAMP (microseconds), time_ns keeps every digit
    if as_chunk:
        sel.append(t)
        sel.append(f"max({s}) AS {s}")
    else:
        sel.append(f"timestamp_micros(({t} - pmod({t}, 1000)) DIV 1000) AS `time`")
        sel.append(t)
    group = ", ".join(tags + [t])
    where = deletes_sql(schema, list(deletes))
    where = f" WHERE {where}" if where else ""
    return f"SELECT {', '.join(sel)} FROM (\n{union}\n){where} GROUP BY {group}"


def spark_struct_for(schema: TableSchema):
    """Spark StructType of a chunk holding `schema`'s columns (plus time_ns and _iox_seq)."""
    from pyspark.sql import types as T

    def _t(typ: str):
        return {"string": T.StringType(), "float": T.DoubleType(), "integer": T.LongType(),
                "uinteger": T.DecimalType(20, 0), "boolean": T.BooleanType()}[typ]

    fields = [T.StructField(c.name, _t(c.type), True) for c in _value_columns(schema)]
    fields += [T.StructField(TIME_NS_COLUMN, T.LongType(), False), T.StructField(SEQ_COLUMN, T.LongType(), False)]
    return T.StructType(fields)
