"""Runs a user's Spark SQL against one database.

Invariant: a query sees each table of its database as the table view at the
moment the query was planned (views are swapped atomically, never edited), in a
session of its own, so concurrent queries on different databases never see
each other's table names.
"""
from __future__ import annotations

import re
import time

import pyarrow as pa

from catalog.catalog import Catalog, DatabaseNotFoundError

from .errors import DatabaseNotFound, InvalidArgument
from .views import empty_table_view_sql, quote, table_view_name

__all__ = ["QueryEngine", "QueryResult"]


class QueryResult:
    def __init__(self, table: pa.Table, applied_hi_inclusive: dict):
        self.table = table
        self.applied_hi_inclusive = applied_hi_inclusive


class QueryEngine:
    def __init__(self, spark, catalog: Catalog):
        self.spark = spark
        self.catalog = catalog

    def run(self, database: str, sql: str) -> QueryResult:
        try:
            db = self.catalog.database(database)
        except DatabaseNotFoundError:
            raise DatabaseNotFound(database) from None
        applied = dict(db.applied_hi_inclusive)
        now = time.time()
        for table in _tables_named(sql, db.table_names()):
            db.queried_at[table] = now
        session = self.spark.newSession()
        existing = {r.viewName if hasattr(r, "viewName") else r[1] for r in
                    self.spark.sql("SHOW VIEWS IN global_temp").collect()}
        for table in sorted(set(db.table_names()) | set(db.schemas.tables())):
            view = table_view_name(database, table)
            if view in existing:
                session.sql(f"CREATE OR REPLACE TEMP VIEW {quote(table)} AS "
                            f"SELECT * FROM global_temp.{quote(view)}")
                continue
            schema = db.schemas.get(table)
            if schema is not None:  # columns known, no row yet: an empty table
                session.sql(f"CREATE OR REPLACE TEMP VIEW {quote(table)} AS {empty_table_view_sql(schema)}")
        try:
            df = session.sql(sql)
            result = df.toArrow()
        except Exception as e:  # Spark analysis/parse errors are the user's to fix
            from pyspark.errors import PySparkException

            if isinstance(e, PySparkException):
                raise InvalidArgument(f"query failed: {_first_line(str(e))}") from e
            raise
        return QueryResult(result, applied)


def _first_line(msg: str) -> str:
    lines = [l for l in msg.strip().splitlines() if l.strip()]
    return " ".join(lines[:3])[:2000] if lines else msg


def _tables_named(sql: str, tables: list) -> list:
    """The tables whose names occur in `sql` as a whole word, ignoring case (Spark's identifiers
    do): every table the query may read, and maybe a few it does not (a name inside a string
    literal), which only moves their chunks to the read buffer sooner."""
    low = sql.lower()
    return [t for t in tables if t.lower() in low
            and re.search(r"(?<![\w$])" + re.escape(t.lower()) + r"(?![\w$])", low)]
