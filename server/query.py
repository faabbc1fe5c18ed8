"""Runs a user's Spark SQL against one database.

Invariant: a query sees each table of its database as the table view at the
moment the query was planned (views are swapped atomically, never edited), in a
session of its own, so concurrent queries on different databases never see
each other's table names. A table the write buffer's tail holds writes or
deletes for (server/write_buffer_tail.py) is read as its chunks plus those
writes, deduplicated and with every delete applied exactly as the consumer will
apply them, from one cut taken under the catalog lock: the result reflects
`visible_hi_inclusive` (>= `applied_hi_inclusive`) of every Kafka partition.

Runs on the driver (the gRPC handler's thread); Spark runs the query.
"""
from __future__ import annotations

import itertools
import re
import time

import pyarrow as pa

from catalog import time_spans
from catalog.catalog import Catalog, DatabaseNotFoundError
from catalog.schema import Column, ColumnTypeConflict, TableSchema

from .errors import DatabaseNotFound, InvalidArgument
from .views import ChunkSource, empty_table_view_sql, quote, spark_struct_for, table_view_name, table_view_sql

__all__ = ["QueryEngine", "QueryResult", "tail_rows"]

_TAIL_VIEWS = itertools.count(1)


class QueryResult:
    def __init__(self, table: pa.Table, applied_hi_inclusive: dict, visible_hi_inclusive: dict | None = None):
        self.table = table
        #: per Kafka partition, the offset the catalog had applied when the query was planned
        self.applied_hi_inclusive = applied_hi_inclusive
        #: per Kafka partition, the offset the result reflects (applied, plus the tail's writes)
        self.visible_hi_inclusive = visible_hi_inclusive if visible_hi_inclusive is not None \
            else dict(applied_hi_inclusive)


class QueryEngine:
    def __init__(self, spark, catalog: Catalog, tail=None):
        self.spark = spark
        self.catalog = catalog
        #: the write buffer's tail (server/write_buffer_tail.py), or None: queries reflect the applied watermark
        self.tail = tail

    def run(self, database: str, sql: str) -> QueryResult:
        from lifecycle.chunk_data import chunk_source, table_deletes

        from .write_buffer import partition_for

        try:
            db = self.catalog.database(database)
        except DatabaseNotFoundError:
            raise DatabaseNotFound(database) from None
        known = set(db.table_names()) | set(db.schemas.tables())
        #: table -> (tail writes, tail deletes, chunk sources, catalog deletes, schema) read in one cut
        from_tail: dict = {}
        with self.catalog.lock:
            applied = dict(db.applied_hi_inclusive)
            visible = dict(applied)
            if self.tail is not None:
                cut = self.tail.cut(db, applied, None)
                visible = cut.visible_hi_inclusive
                for table in _tables_named(sql, sorted(known | set(cut.writes))):
                    writes = cut.writes.get(table, [])
                    kp = partition_for(table, db.kafka_partitions)
                    deletes = [d for d in cut.deletes if d.applies_to(table, kp)]
                    if writes or deletes:
                        chunks = [chunk_source(c) for c in self.catalog.table_chunks(db, table) if c.view is not None]
                        from_tail[table] = (writes, deletes, chunks, table_deletes(db, table), db.schemas.get(table))
        now = time.time()
        for table in _tables_named(sql, db.table_names()):
            db.queried_at[table] = now
        session = self.spark.newSession()
        existing = {r.viewName if hasattr(r, "viewName") else r[1] for r in
                    self.spark.sql("SHOW VIEWS IN global_temp").collect()}
        try:
            for table in sorted(known | set(from_tail)):
                if table in from_tail:
                    session.sql(f"CREATE OR REPLACE TEMP VIEW {quote(table)} AS "
                                f"{_tail_view_sql(session, table, db.epoch, *from_tail[table])}")
                    continue
                view = table_view_name(database, table)
                if view in existing:
                    session.sql(f"CREATE OR REPLACE TEMP VIEW {quote(table)} AS "
                                f"SELECT * FROM global_temp.{quote(view)}")
                    continue
                schema = db.schemas.get(table)
                if schema is not None:  # columns known, no row yet: an empty table
                    session.sql(f"CREATE OR REPLACE TEMP VIEW {quote(table)} AS {empty_table_view_sql(schema)}")
            df = session.sql(sql)
            result = df.toArrow()
        except Exception as e:  # Spark analysis/parse errors are the user's to fix
            from pyspark.errors import PySparkException

            if isinstance(e, PySparkException):
                raise InvalidArgument(f"query failed: {_first_line(str(e))}") from e
            raise
        return QueryResult(result, applied, visible)


def _tail_view_sql(session, table: str, epoch: int, writes: list, tail_deletes: list, chunks: list,
                   deletes: list, schema: TableSchema | None) -> str:
    """The table view over its chunks and its tail writes, with the catalog's and the tail's deletes.
    The tail's rows become a temp view of `session` (a local relation from Arrow)."""
    from .ingest import disjoint_unique

    schema = TableSchema(table, schema.columns if schema is not None else [])
    for w in writes:
        cols = [Column(*c) for c in w.columns]
        try:
            schema.merge(cols)
        except ColumnTypeConflict:  # as the consumer does: new columns kept, conflicting values read as NULL
            schema.merge([c for c in cols if schema.get(c.name) is None])
    sources = list(chunks)
    rows = tail_rows(writes, [(c.name, c.type) for c in schema.columns if c.role != "time"], epoch)
    if rows is not None and rows.num_rows:
        name = f"iox_tail_{next(_TAIL_VIEWS)}"
        session.createDataFrame(rows, schema=spark_struct_for(schema)).createOrReplaceTempView(name)
        spans = [(min(lo for lo, _hi in w.spans), max(hi for _lo, hi in w.spans), w.unique) for w in writes if w.spans]
        sources.append(ChunkSource(quote(name), {c.name for c in schema.columns if c.role != "time"},
                                   min(lo for lo, _hi, _u in spans), max(hi for _lo, hi, _u in spans),
                                   deduplicated=disjoint_unique(spans),
                                   time_spans=time_spans.normalize([s for w in writes for s in w.spans])))
    if not sources:
        return empty_table_view_sql(schema)
    return table_view_sql(schema, sources, deletes=list(deletes) + list(tail_deletes))


def tail_rows(writes: list, columns: list, epoch: int) -> pa.Table | None:
    """The rows of tail writes in the chunk layout of `columns` [(name, type)] (+ time_ns, _iox_seq),
    in write-buffer order; a payload that does not decode yields no rows, as the consumer skips it.
    None when there are no rows. Pure."""
    from lifecycle.ipc_segments import LAYOUT_WIRE, chunk_table

    from .ingest import seq_base
    from .wire_format import decode_payload, decoded_problem

    out = []
    for w in writes:
        try:
            t = decode_payload(w.payload)
        except Exception:  # noqa: BLE001 - untrusted bytes: the consumer skips this write
            continue
        if decoded_problem(t) is None:
            out.append(chunk_table(t, LAYOUT_WIRE, seq_base(epoch, w.offset), None, None, columns))
    return pa.concat_tables(out) if out else None


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
