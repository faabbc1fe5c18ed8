"""Runs a user's Spark SQL against one database.

Invariant: a query sees each table of its database as the table view at the
moment the query was planned (views are swapped atomically, never edited), in a
session of its own, so concurrent queries on different databases never see
each other's table names. A table the write buffer's tail holds writes or
deletes for (server/query/tail.py) is read as its chunks plus those
writes, deduplicated and with every delete applied exactly as the consumer will
apply them, from one cut of the catalog (`Catalog.query_cut`): the result reflects
`visible_hi_inclusive` (>= `applied_hi_inclusive`) of every Kafka partition.
A table of at most SMALL_TABLE_ROWS rows whose chunks are all local
(chunk_store/local_rows.py) is merged with its tail rows (if any) in Arrow on the
driver and read as one local relation: the same rows, with no Python worker;
a query that only filters and projects such tables is answered on the driver
without a Spark job (`arrow_batches`), so it never waits for a task slot.
Any other result streams from its Spark job in partition order (`arrow_batches`); the query keeps
its pin until the result is read or closed.
A statement runs only once the SQL sandbox (server/query/sql_sandbox.py) found it a read-only query whose
relations are the database's tables, each then a view of the query's session; SHOW TABLES lists
only those views.

Runs on the driver (the gRPC handler's thread); Spark runs the query.
"""
from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from iox_spark.catalog import time_spans
from iox_spark.catalog.retention import reader_lo_ns
from iox_spark.catalog.catalog import Catalog, DatabaseNotFoundError
from iox_spark.catalog.schema import TIME_NS_COLUMN, Column, ColumnTypeConflict, TableSchema

from iox_spark.server.errors import DatabaseNotFound, InvalidArgument, QueryResultTooLarge, QueryTimedOut
from iox_spark.server.query.sql_sandbox import check_query, checked_dataframe, require_tables
from iox_spark.chunk_store.chunk_views import hide_chunk_views, query_session
from iox_spark.chunk_store.views import ChunkSource, empty_table_view_sql, quote, spark_struct_for, table_view_sql

__all__ = ["QueryEngine", "QueryResult", "arrow_batches", "in_partition_order", "tail_rows", "tables_named"]

_TAIL_VIEWS = itertools.count(1)

log = logging.getLogger(__name__)


class QueryResult:
    """A query's answer: its Arrow `schema`, its record batches in the result's order (streamed from
    Spark as its partitions complete, `batches()`, read once) and the watermarks it reflects.

    The query's pin (catalog/query_pins.py) is held until the batches are read to their end or
    `close()` is called; whoever takes a QueryResult reads it through or closes it (one dropped
    unread releases its pin when it is collected). `table` reads every batch into one table. Errors of
    the running query (QueryResultTooLarge, InvalidArgument) are raised while the batches are read."""

    def __init__(self, schema: pa.Schema, batches, applied_hi_inclusive: dict,
                 visible_hi_inclusive: dict | None = None):
        self.schema = schema
        self._batches = batches
        self._table: pa.Table | None = None
        #: (QueryPins, ticket) of the query's pin until it is released
        self._pin = None
        #: per Kafka partition, the offset the catalog had applied when the query was planned
        self.applied_hi_inclusive = applied_hi_inclusive
        #: per Kafka partition, the offset the result reflects (applied, plus the tail's writes)
        self.visible_hi_inclusive = visible_hi_inclusive if visible_hi_inclusive is not None \
            else dict(applied_hi_inclusive)
        #: set by the query service (server/query_service.py `query`): the answer ran during a replay (allow_partial) and may
        #: lack acknowledged writes; the write buffer the watermarks are offsets of
        self.partial = False
        self.topic = ""
        self.topic_id = ""
        self.epoch = 0

    def batches(self):
        """The result's record batches, in order, each once; the pin is released at the end."""
        if self._table is not None:
            yield from self._table.to_batches()
            return
        it, self._batches = self._batches, iter(())
        try:
            yield from it  # closing this generator closes `it` too
        finally:
            self.close()

    @property
    def table(self) -> pa.Table:
        """Every batch in one table (read on first use)."""
        if self._table is None:
            self._table = pa.Table.from_batches(list(self.batches()), schema=self.schema)
        return self._table

    def close(self) -> None:
        """Stops reading the result (if still running) and releases the query's pin. Idempotent."""
        _close(self._batches)
        pin, self._pin = self._pin, None
        if pin is not None:
            pin[0].unpin(pin[1])

    def __del__(self):
        # an answer dropped unread (or unclosed) releases its pin once collected
        pin, self._pin = self._pin, None
        if pin is not None:
            pin[0].release_later(pin[1])


class QueryEngine:
    def __init__(self, spark, catalog: Catalog, tail, table_view_sql_of, max_rows: int = 0,
                 max_bytes: int = 0, timeout_s: float = 0.0):
        self.spark = spark
        #: --query-timeout-s: a query's Spark job running longer is cancelled (QueryTimedOut); 0 = none
        self.timeout_s = timeout_s
        #: result limits (--max-query-rows, --max-query-bytes); 0 = none. Past one: QueryResultTooLarge
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.catalog = catalog
        #: the write buffer's tail (server/query/tail.py), or None: queries reflect the applied watermark
        self.tail = tail
        #: (database, table) -> the SQL of its table view, or None (the ingestor's `table_view_sql_of`):
        #: a query reads the view this server made, never a global view by name (another Spark Connect
        #: session or server in the Spark application may have replaced or dropped that)
        self.table_view_sql_of = table_view_sql_of

    def run(self, *args, **kwargs) -> QueryResult:
        """Plans a query (`_run`) holding a query pin (catalog/query_pins.py) until its result is read
        or closed: files the retention pruner removes from the catalog meanwhile are deleted only after
        this query's answer is complete."""
        pins = self.catalog.query_pins
        ticket = pins.pin()
        try:
            res = self._run(*args, **kwargs)
        except BaseException:
            pins.unpin(ticket)
            raise
        res._pin = (pins, ticket)
        return res

    def tables_read(self, db, sql: str) -> list:
        """The tables of `db` a query of `sql` may read: those it names (also ones not known here
        yet; none for a query that names none, such as `SELECT 1`), every known table for a
        statement that lists them. A query the sandbox refuses or Spark cannot parse may read any
        known table (the query itself then says why)."""
        return self.reads(db, sql)[0]

    def reads(self, db, sql: str) -> tuple[list, dict]:
        """(`tables_read`, {table: TableScan}): with the tables, what the query reads of them, for
        an ingester pool's owners to send only that (server/query/pushdown.py; a table without a
        scan: all of it)."""
        from iox_spark.server.query.pushdown import scans

        known = sorted(set(db.table_names()) | set(db.schemas.tables()))
        if _lists_tables(sql):
            return known, {}
        named = set(tables_named(sql, known))
        try:
            checked = _checked(self.spark.newSession(), db.name, sql)
        except Exception:  # noqa: BLE001 - refused or unparsable: the query's own run raises it
            return (sorted(named) if named else known), {}
        named |= set(checked.tables)
        if checked.lists_tables:
            return sorted(named), {}
        return sorted(named), scans(checked.tree, {t: db.schemas.get(t) for t in named}, sql)

    def _run(self, database: str, sql: str, remote: tuple | None = None) -> QueryResult:
        """`remote`: in an ingester pool, ({table: OwnerRows}, {kp: applied offset at its owner}) of
        the tables another member owns (server/pool/rows.py `gather`)."""
        from iox_spark.chunk_store.chunk_data import chunk_source

        from iox_spark.server.runtime.spark import use_query_pool
        from iox_spark.catalog.sharding import partition_for

        t0 = time.perf_counter()
        try:
            db = self.catalog.database(database)
        except DatabaseNotFoundError:
            raise DatabaseNotFound(database) from None
        # a clone of the server's session: it sees the chunk views (chunk_store/chunk_views.py) until
        # the table views are built, then only those
        session = query_session(self.spark)
        checked = _checked(session, database, sql)
        known = set(db.table_names()) | set(db.schemas.tables())

        def at_cut(applied):  # the tail's writes and deletes past `applied`, at the cut
            return self.tail.cut(db, applied) if self.tail is not None else None

        def tables_to_read(cut):
            candidates = sorted(known | set(remote[0] if remote is not None else ()) |
                                set(cut.writes if cut is not None else ()))
            named = sorted(set(tables_named(sql, candidates)) | (checked.tables & set(candidates)))
            # a statement that lists tables sees them all; any other reads only the tables it names
            return candidates if _lists_tables(sql) or not named else named

        def read(table, chunks, deletes, schema, cut):
            r = _TableRead(rows=sum(c.rows for c in chunks))
            if cut is not None:
                kp = partition_for(table, db.kafka_partitions)
                r.tail_writes = cut.writes.get(table, [])
                r.tail_deletes = [d for d in cut.deletes if d.applies_to(table, kp)]
            if remote is not None and table in remote[0]:
                r.remote = remote[0][table]
            all_local = all(c.local_rows is not None and c.view is not None for c in chunks)
            if r.from_tail or (chunks and all_local):
                r.chunks = [chunk_source(c) for c in chunks if c.view is not None]
                if all_local:
                    r.local = [c.local_rows for c in chunks]
                r.deletes = deletes
                r.schema = schema
            return r

        # every table read in one cut (catalog/catalog.py `query_cut`)
        applied, retention_period_s, cut, reads = self.catalog.query_cut(db, at_cut, tables_to_read, read)
        # retention: no row older than reader_lo, from the clock at the cut (catalog/retention.py)
        lo = reader_lo_ns(retention_period_s, time.time())
        visible = cut.visible_hi_inclusive if cut is not None else dict(applied)
        if remote is not None:  # the owners' partitions reflect what their owners applied
            visible = dict(visible)
            for kp, off in remote[1].items():
                visible[kp] = max(visible.get(kp, -1), off)
        now = time.time()
        db.note_queried(tables_named(sql, db.table_names()), now)
        t_cut = time.perf_counter()
        use_query_pool(self.spark)
        try:
            n_tail = 0
            views = {}  # table -> its view's DataFrame (an analysed plan: no name of a chunk view in it)
            for table, r in sorted(reads.items()):
                if r.from_tail or r.local:
                    n_tail += r.from_tail
                    views[table] = _retained(_tail_view(session, table, db.seq_origin, r), lo)
                    continue
                view_sql = self.table_view_sql_of(database, table)
                if view_sql is None:
                    if db.schemas.get(table) is None:
                        continue
                    view_sql = empty_table_view_sql(db.schemas.get(table))  # columns known, no row yet
                views[table] = session.sql(_small(_retained_sql(view_sql, lo), r.rows))
            hide_chunk_views(session)
            for table, df in views.items():
                df.createOrReplaceTempView(quote(table))
            made = set(views)  # the tables with a view in the session
            # a name without a view of ours would be looked up among the catalog's tables
            require_tables(database, checked.tables, made)
            t_views = time.perf_counter()
            df = checked_dataframe(session, checked)
            t_sql = time.perf_counter()
            if self.max_rows:
                df = df.limit(self.max_rows + 1)  # one more row than allowed tells a result over the limit
            schema, batches = arrow_batches(df, self.max_bytes, self.max_rows, self.timeout_s)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("query on %s: cut %.3f s, views %.3f s (%d table(s), %d from the tail), planned %.3f s "
                          "(analysis %.3f s)", database, t_cut - t0, t_views - t_cut, len(reads), n_tail,
                          time.perf_counter() - t_views, t_sql - t_views)
        except Exception as e:  # Spark analysis/parse errors are the user's to fix
            _raise_as_user_error(e)
        only_temporary = checked.lists_tables and "isTemporary" in schema.names
        return QueryResult(schema, _as_user_errors(batches, only_temporary), applied, visible)


def _raise_as_user_error(e: Exception):
    """Raises `e`, a Spark error (analysis, parse, a failing expression) as InvalidArgument."""
    from pyspark.errors import PySparkException

    if isinstance(e, PySparkException):
        raise InvalidArgument(f"query failed: {_first_line(str(e))}") from e
    raise e


def _as_user_errors(batches, only_temporary: bool):
    """The query's batches; for SHOW TABLES only the session's temporary views (the database's tables;
    catalog tables are not). Spark errors while the query runs become InvalidArgument."""
    try:
        for b in batches:
            if only_temporary:
                b = b.filter(pc.equal(b.column("isTemporary"), True))
            yield b
    except Exception as e:  # noqa: BLE001 - re-raised, Spark's errors as the user's
        _raise_as_user_error(e)
    finally:
        _close(batches)


#: A table of at most this many rows (chunks and tail) is read by one Spark task: a query of a small
#: table then waits for one free task slot instead of one per chunk while micro-batches hold the slots.
SMALL_TABLE_ROWS = 100_000


@dataclass
class _TableRead:
    """What a query reads of one table, taken in the query's cut."""

    rows: int = 0  # rows of its chunks (without the tail)
    tail_writes: list = field(default_factory=list)
    tail_deletes: list = field(default_factory=list)
    #: set when the tail holds writes or deletes of it: the view is built from these, not the global view
    chunks: list = field(default_factory=list)
    deletes: list = field(default_factory=list)
    schema: TableSchema | None = None
    #: its chunks' rows when every one is local (chunk_store/local_rows.py), else None
    local: list | None = None
    #: in an ingester pool, for a table another member owns: its owner's unpersisted rows and
    #: deletes (server/pool/rows.py OwnerRows), read next to the chunks like the tail's
    remote: object = None

    @property
    def from_tail(self) -> bool:
        return bool(self.tail_writes or self.tail_deletes or self.remote is not None)


def _retained(df, reader_lo_ns: int | None):
    """`df` (a table view) without the rows older than `reader_lo_ns` (None: all of them)."""
    if reader_lo_ns is None:
        return df
    from pyspark.sql import functions as F

    return df.where(F.col(TIME_NS_COLUMN) >= F.lit(reader_lo_ns))


def _retained_sql(view_sql: str, reader_lo_ns: int | None) -> str:
    """`view_sql` without the rows older than `reader_lo_ns` (None: all of them)."""
    if reader_lo_ns is None:
        return view_sql
    return f"SELECT * FROM ({view_sql}) WHERE {quote(TIME_NS_COLUMN)} >= {int(reader_lo_ns)}"


def _small(view_sql: str, rows: int) -> str:
    """`view_sql`, read by one task when the table is small (SMALL_TABLE_ROWS)."""
    return f"SELECT /*+ COALESCE(1) */ * FROM ({view_sql})" if rows <= SMALL_TABLE_ROWS else view_sql


def _tail_view(session, table: str, seq_origin: int, r: _TableRead):
    """The table view, as a DataFrame of `session`, over its chunks and its tail writes, with the
    catalog's and the tail's deletes. The tail's rows are a local relation from Arrow, named only
    while the view is analysed (a DataFrame's temp view keeps its analysed plan), so no name of
    ours shows up among the session's tables."""
    from iox_spark.server.consume.ingest import disjoint_unique

    writes = r.tail_writes
    schema = TableSchema(table, r.schema.columns if r.schema is not None else [])
    for w in writes:
        cols = [Column(*c) for c in w.columns]
        try:
            schema.merge(cols)
        except ColumnTypeConflict:  # as the consumer does: new columns kept, conflicting values read as NULL
            schema.merge([c for c in cols if schema.get(c.name) is None])
    owner = r.remote
    if owner is not None:  # another pool member's unpersisted rows: its columns, rows and deletes
        cols = [Column(*c) for c in owner.columns]
        schema.merge([c for c in cols if schema.get(c.name) is None])
        r.tail_deletes = list(r.tail_deletes) + list(owner.deletes)
    rows = tail_rows(writes, [(c.name, c.type) for c in schema.columns if c.role != "time"], seq_origin)
    if owner is not None and owner.rows is not None and owner.rows.num_rows:
        from iox_spark.chunk_store.local_rows import conform

        theirs = conform(owner.rows, schema.to_json())
        rows = theirs if rows is None else pa.concat_tables([conform(rows, schema.to_json()), theirs],
                                                            promote_options="permissive")
    if r.local is not None:
        local = _local_merge(session, schema, r, rows)
        if local is not None:
            return local
    sources = list(r.chunks)
    name = None
    if rows is not None and rows.num_rows:
        r.rows += rows.num_rows
        name = f"iox_tail_{next(_TAIL_VIEWS)}"
        session.createDataFrame(rows, schema=spark_struct_for(schema)).createOrReplaceTempView(name)
        mm = pc.min_max(rows.column(TIME_NS_COLUMN))
        # each write's span from its headers, as the consumer's chunks take them (None: the hull)
        per_write = [(min(lo for lo, _hi in w.spans), max(hi for _lo, hi in w.spans), w.unique)
                     for w in writes if w.spans]
        # the tail's writes alone carry their spans; an owner's rows (a pool) are read by their hull
        complete = len(per_write) == len(writes) and not (owner is not None and owner.rows is not None
                                                          and owner.rows.num_rows)
        sources.append(ChunkSource(quote(name), {c.name for c in schema.columns if c.role != "time"},
                                   mm["min"].as_py(), mm["max"].as_py(),
                                   deduplicated=complete and disjoint_unique(per_write),
                                   time_spans=time_spans.normalize([s for w in writes for s in w.spans])
                                   if complete else ()))
    sql = table_view_sql(schema, sources, deletes=list(r.deletes) + list(r.tail_deletes)) if sources \
        else empty_table_view_sql(schema)
    df = session.sql(_small(sql, r.rows))
    if name is not None:
        session.catalog.dropTempView(name)
    return df


def _local_merge(session, schema: TableSchema, r: _TableRead, tail: pa.Table | None):
    """The table view of a small table whose chunks are all local (chunk_store/local_rows.py), as a
    DataFrame of `session`: its chunks' rows and the tail's rows `tail` (in `schema`'s layout), the
    deletes applied and the rows deduplicated in Arrow on the driver (chunk_store/arrow_merge.py: the
    rows the SQL view gives), read as one local relation: no Python worker and no GROUP BY in Spark.
    None when it does not apply (more than SMALL_TABLE_ROWS rows, or a delete Arrow does not
    evaluate): the caller builds the view from the chunks' views."""
    from iox_spark.chunk_store.local_rows import conform, merge_rows

    if sum(t.num_rows for t in r.local) + (tail.num_rows if tail is not None else 0) > SMALL_TABLE_ROWS:
        return None
    columns = schema.to_json()
    parts = [conform(t, columns) for t in r.local] + ([tail] if tail is not None else [])
    if not parts:
        return session.sql(empty_table_view_sql(schema))
    t = merge_rows(pa.concat_tables(parts, promote_options="permissive"), schema,
                   list(r.deletes) + list(r.tail_deletes))
    if t is None:  # a delete Arrow does not evaluate
        return None
    if not t.num_rows:
        return session.sql(empty_table_view_sql(schema))
    name = f"iox_tail_{next(_TAIL_VIEWS)}"
    session.createDataFrame(t, schema=spark_struct_for(schema)).createOrReplaceTempView(name)
    mm = pc.min_max(t.column(TIME_NS_COLUMN))
    src = ChunkSource(quote(name), {c.name for c in schema.columns if c.role != "time"}, mm["min"].as_py(),
                      mm["max"].as_py(), deduplicated=True)
    # no COALESCE hint: a projection or filter of a local relation is folded into one, which
    # `arrow_batches` reads without a Spark job
    df = session.sql(table_view_sql(schema, [src]))
    session.catalog.dropTempView(name)
    return df


def _close(it) -> None:
    """Closes `it` when it is a generator (its `finally` runs: a socket closed, a job cancelled)."""
    close = getattr(it, "close", None)
    if close is not None:
        close()


def arrow_batches(df, max_bytes: int = 0, max_rows: int = 0, timeout_s: float = 0.0):
    """(schema, batches): `df`'s result as Arrow record batches in the order `df.toArrow()` has them,
    streamed while Spark runs the query. Driver side.

    A plan that is a local relation (a small table merged on the driver by `_local_merge`, filtered
    and projected; Spark folds those into the relation) is converted on the driver by Spark's own
    ArrowConverters, as Spark Connect serves such a plan, without a Spark job (a job waits for a free
    task slot, behind the micro-batches' tasks under load). Any other plan runs as one Spark job
    (`_partition_ordered`). `max_bytes`, `max_rows` (0 = no limit): the batches are counted as they
    arrive; past a limit the query stops (QueryResultTooLarge naming --max-query-bytes or
    --max-query-rows), so the driver never holds more than the limit and a batch. `timeout_s` (0 =
    none): a Spark job still running that long after it started is cancelled (QueryTimedOut)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    spark = df.sparkSession
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    schema = to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                             prefers_large_types=large)
    # the rows tagged with their partition (`_partition_ordered`); its optimized plan, kept by its
    # query execution for the job, tells a local relation (Spark folds the tag into it, every row's
    # tag 0, or keeps a projection over it): only the job's plan is optimized and planned
    tagged = df.select("*", F.spark_partition_id().alias(_PARTITION_COLUMN))
    opt = tagged._jdf.queryExecution().optimizedPlan()
    if opt.nodeName() == "Project":
        opt = opt.children().apply(0)
    if opt.nodeName() != "LocalRelation":
        return schema, _conformed(_partition_ordered(tagged, timeout_s, max_bytes), schema, max_bytes, max_rows)
    plan = df._jdf.queryExecution().executedPlan()
    if plan.nodeName() != "LocalTableScan":  # not expected; tags folded into a relation are all 0: Spark's own order
        return schema, _conformed(iter(df.toArrow().to_batches()), schema, max_bytes, max_rows)
    conv = getattr(getattr(spark._jvm.org.apache.spark.sql.execution.arrow, "ArrowConverters$"), "MODULE$")
    it = conv.toBatchWithSchemaIterator(plan.rows().iterator(), plan.schema(), _ARROW_BATCH_ROWS, _ARROW_BATCH_BYTES,
                                        spark.conf.get("spark.sql.session.timeZone"), True, large)
    return schema, _conformed(_local_batches(it), schema, max_bytes, max_rows)


def _local_batches(it):
    while it.hasNext():
        yield from pa.ipc.open_stream(pa.py_buffer(it.next())).read_all().to_batches()


def _conformed(batches, schema: pa.Schema, max_bytes: int, max_rows: int):
    """`batches` in `schema` (Spark's Arrow types, as `toArrow` casts them), counted against
    `max_bytes` and `max_rows`."""
    used = rows = 0
    try:
        for b in batches:
            used += b.nbytes
            rows += b.num_rows
            if max_bytes and used > max_bytes:
                raise QueryResultTooLarge("bytes", max_bytes, "--max-query-bytes")
            if max_rows and rows > max_rows:
                raise QueryResultTooLarge("rows", max_rows, "--max-query-rows")
            if not b.schema.equals(schema):
                b = pa.RecordBatch.from_arrays([c.cast(f.type) for c, f in zip(b.columns, schema)], schema=schema)
            yield b
    finally:
        _close(batches)


#: the column `_partition_ordered` adds to a result: the Spark partition each row comes from
_PARTITION_COLUMN = "__iox_result_partition"
#: the job tags of streamed queries (one per query: cancelling one stops only its job)
_QUERY_JOB_TAGS = itertools.count(1)


def _partition_ordered(tagged, timeout_s: float = 0.0, max_bytes: int = 0):
    """The result batches of `tagged` (a DataFrame whose last column, `_PARTITION_COLUMN`, is each
    row's `spark_partition_id()`) without that column, in partition order, each yielded as soon as
    every earlier partition is done.

    Spark's `collectAsArrowToPython` (one job, every partition in parallel) sends each partition's
    batches together as the partition completes, in completion order, and the order only at the end.
    Each row is tagged with its partition (`spark_partition_id()`, a column dropped here), so the
    batches of the next partition due stream through at once and later partitions wait in memory
    until it is done (a partition is done when another one's batches arrive; an empty partition sends
    nothing, so the ones after it wait until the end). Closing the generator early (a client gone, a
    limit passed) closes the socket and cancels the job (its job tag), so its tasks free their slots.
    A job still running `timeout_s` after it started is cancelled the same way (a timer), and the
    result ends with QueryTimedOut. `max_bytes` (0 = none) counts every batch as it arrives, also
    one parked behind an earlier partition: past it, QueryResultTooLarge."""
    from pyspark.serializers import read_int
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.traceback_utils import SCCallSiteSync
    from pyspark.util import _create_local_socket

    sc = tagged._sc
    job_tag = f"iox-query-{next(_QUERY_JOB_TAGS)}"
    sc.addJobTag(job_tag)  # the job's thread inherits it: a stream closed early cancels the job
    try:
        with SCCallSiteSync(sc):
            port, auth_secret, jserver = tagged._jdf.collectAsArrowToPython()
    finally:
        sc.removeJobTag(job_tag)
    sockfile, sock = _create_local_socket((port, auth_secret))
    complete = False
    timed_out, finished = threading.Event(), threading.Event()

    def time_out():
        if finished.wait(timeout_s):
            return
        timed_out.set()
        # again and again until the stream ends: a cancel before the job was submitted (it is, once
        # the socket is read) would miss it
        while not finished.is_set():
            sc.cancelJobsWithTag(job_tag)
            finished.wait(0.5)

    timer = threading.Thread(target=time_out, name=f"{job_tag}-timeout", daemon=True) if timeout_s else None
    if timer is not None:
        timer.start()

    def tagged_batches():
        nonlocal complete
        arrived = 0
        for b in ArrowStreamSerializer().load_stream(sockfile):
            arrived += b.nbytes
            if max_bytes and arrived > max_bytes:  # what is parked counts as much as what was sent on
                raise QueryResultTooLarge("bytes", max_bytes, "--max-query-bytes")
            if b.num_rows:
                yield b.column(b.num_columns - 1)[0].as_py(), \
                    pa.RecordBatch.from_arrays(b.columns[:-1], schema=b.schema.remove(b.num_columns - 1))
        num = read_int(sockfile)
        if num == -1:
            from pyspark.serializers import UTF8Deserializer

            raise InvalidArgument(f"query failed: {_first_line(UTF8Deserializer().loads(sockfile))}")
        for _ in range(num):  # the order, known from the partitions
            read_int(sockfile)
        complete = True

    try:
        yield from in_partition_order(tagged_batches())
        if timed_out.is_set():  # a cancelled job's stream may end as if it were complete, with rows missing
            raise QueryTimedOut(timeout_s)
    except Exception as e:
        if timed_out.is_set() and not isinstance(e, QueryTimedOut):
            raise QueryTimedOut(timeout_s) from e
        raise
    finally:
        finished.set()
        sockfile.close()
        sock.close()
        if timed_out.is_set():
            complete = False  # never taken as a result: only the (redundant) cancel remains
        if complete:
            from pyspark.errors.exceptions.captured import unwrap_spark_exception

            with unwrap_spark_exception():
                jserver.getResult()
        else:  # closed early, over a limit or failed: its remaining tasks free their slots
            sc.cancelJobsWithTag(job_tag)


def in_partition_order(tagged):
    """The batches of `tagged` [(partition, batch)], where each partition's batches come together
    (partitions in any order, empty ones absent), in partition order: a batch of the partition due
    next is yielded as soon as it arrives; the others wait until every earlier partition is done (a
    partition is done when another one's batches arrive, or at the end). Pure."""
    due = 0  # the partition whose batches go out next
    current = None  # the partition whose batches are arriving
    waiting: dict = {}  # partition -> its batches, arrived before their turn
    done: set = set()  # partitions whose batches all arrived and wait in `waiting` (or are empty)
    for part, b in tagged:
        if part != current:
            if current is not None:
                done.add(current)
            current = part
            while due in done:  # send what waited behind the partition now done
                done.discard(due)
                yield from waiting.pop(due, ())
                due += 1
        if part == due:
            yield b
        else:
            waiting.setdefault(part, []).append(b)
    for part in sorted(waiting):
        yield from waiting.pop(part)


#: the Arrow batches `arrow_batches` converts a local relation's rows in (rows, estimated bytes)
_ARROW_BATCH_ROWS = 10_000
_ARROW_BATCH_BYTES = 64 * 1024 * 1024


def tail_rows(writes: list, columns: list, seq_origin: int) -> pa.Table | None:
    """The rows of tail writes in the chunk layout of `columns` [(name, type)] (+ time_ns, _iox_seq
    from the database's `seq_origin`, as the consumer computes it), in write-buffer order; a payload
    that does not decode yields no rows, as the consumer skips it. None when there are no rows. Pure."""
    from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE, chunk_table

    from iox_spark.catalog.seq_layout import seq_base
    from iox_spark.server.write_buffer.wire_format import decode_payload, decoded_problem

    out = []
    for w in writes:
        try:
            t = decode_payload(w.payload)
        except Exception:  # noqa: BLE001 - untrusted bytes: the consumer skips this write
            continue
        if decoded_problem(t) is None:
            out.append(chunk_table(t, LAYOUT_WIRE, seq_base(seq_origin, w.offset), None, None, columns))
    return pa.concat_tables(out) if out else None


def _checked(session, database: str, sql: str):
    """`sql` checked by the SQL sandbox (server/query/sql_sandbox.py) for `database`, about to run in
    `session`: a QueryRefused when it may not run, InvalidArgument when Spark cannot parse it."""
    from pyspark.errors import PySparkException

    try:
        return check_query(session, database, sql)
    except PySparkException as e:
        raise InvalidArgument(f"query failed: {_first_line(str(e))}") from e


def _first_line(msg: str) -> str:
    lines = [l for l in msg.strip().splitlines() if l.strip()]
    return " ".join(lines[:3])[:2000] if lines else msg


def _lists_tables(sql: str) -> bool:
    """A statement that lists or describes tables (SHOW ..., DESCRIBE ...): it may read any of them."""
    return re.match(r"\s*(show|describe|desc)\b", sql, re.IGNORECASE) is not None


def tables_named(sql: str, tables: list) -> list:
    """The tables whose names occur in `sql` as a whole word, ignoring case (Spark's identifiers
    do): every table the query may read, and maybe a few it does not (a name inside a string
    literal), which only moves their chunks to the read buffer sooner."""
    low = sql.lower()
    return [t for t in tables if t.lower() in low
            and re.search(r"(?<![\w$])" + re.escape(t.lower()) + r"(?![\w$])", low)]
