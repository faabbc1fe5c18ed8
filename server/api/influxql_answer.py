"""InfluxQL answers in each protocol's shape: InfluxDB 1.x's JSON of `/query` (whole or chunked),
and InfluxDB 3's table (`/api/v3/query_influxql`, Flight tickets of query_type `influxql`).

Invariants:
- Every statement runs through `QueryService.query` (server/query_service.py;
  server/query/influxql.py): the token's scope is checked on each database a statement reads (an
  `ON db` clause too), and SHOW DATABASES lists only the databases the token may query.
- Answers stream: statements run one after another as their answer is written, a SELECT's series
  one by one (server/query/influxql.py `stream`); the answer is written in pieces, never built
  whole. 1.x's JSON (`v1_pieces`) is the text `json.dumps` makes of the whole document, in pieces;
  its chunked answer (`v1_chunks`) one document per line, as 1.x sends it. InfluxDB 3's table
  (`V3Answer`) has its columns and their types before its first row: the columns of every
  measurement's SeriesShape (its group-by tags, then its columns), each typed by the kinds of
  values it may hold (ints and floats together: floats; mixed otherwise: text); its rows come in
  record batches of `_V3_BATCH_ROWS` rows (a larger series cut, smaller ones gathered: besides the
  series being read, only the cells of the batch being built are held). A SHOW statement's few
  series come whole.
- A statement's first series is made before anything of the statement is written (`stream`): what
  fails until then is the statement's error; what fails later raises from the pieces, and the
  caller cuts its answer off.

Where it runs: HTTP worker threads and gRPC handler threads (driver).
"""
from __future__ import annotations

import datetime
import decimal
import json
import math
import time
from collections.abc import Iterable, Iterator

import pyarrow as pa

from iox_spark.server.api.api_parts import Queries
from iox_spark.server.query.influxql import Series, StatementResult, stream

__all__ = ["AnswerContext", "run", "v1_pieces", "v1_chunks", "V3Answer", "EPOCHS", "MEASUREMENT_COLUMN"]

#: 1.x's `epoch` units: nanoseconds per unit
EPOCHS = {"ns": 1, "n": 1, "u": 1_000, "µ": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
          "h": 3_600_000_000_000}
#: InfluxDB 3's column naming each row's measurement in an InfluxQL answer
MEASUREMENT_COLUMN = "iox::measurement"


class AnswerContext:
    """What InfluxQL needs of the server: its `queries` (server/api/api_parts.py `Queries`: query,
    table_columns, database_names), the token's `scope` (None: no tokens) and the request's `deadline_s`."""

    def __init__(self, queries: Queries, scope=None, deadline_s: float | None = None):
        self.queries, self.scope, self.deadline_s = queries, scope, deadline_s

    def _check(self, database: str) -> None:
        if self.scope is not None:
            self.scope.check("query", database)

    def run_sql(self, database: str, sql: str):
        """The query's QueryResult (server/query/engine.py): its caller reads its batches or closes it."""
        self._check(database)
        return self.queries.query(database, sql, "", False, deadline_s=self.deadline_s)

    def tables(self, database: str) -> dict:
        self._check(database)
        return self.queries.table_columns(database)

    def databases(self) -> list:
        return [d for d in self.queries.database_names() if self.scope is None or self.scope.allows("query", d)]


def run(ctx: AnswerContext, database: str, text: str, params: dict | None = None) -> Iterator[StatementResult]:
    """The statements' results, each run as it is read (server/query/influxql.py `stream`; close the
    iterator when done); InfluxQLSyntaxError at once when the text does not parse, or `params` does
    not fit its `$name` placeholders."""
    return stream(text, database, ctx.run_sql, ctx.tables, ctx.databases, time.time_ns(), params)


def _rfc3339(ns: int, tz: str | None) -> str:
    """RFC 3339 with nanoseconds, trailing zeros trimmed (Go's RFC3339Nano), in `tz` when given."""
    secs, frac = divmod(ns, 1_000_000_000)
    zone = datetime.timezone.utc
    if tz:
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(tz)
    dt = datetime.datetime.fromtimestamp(secs, tz=datetime.timezone.utc).astimezone(zone)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    off = dt.utcoffset()
    if not off:
        return text + "Z"
    minutes = int(off.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{text}{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _value(v):
    """A value as 1.x's JSON writes it: NaN and infinities null, decimals as numbers, anything else
    that is not a JSON scalar as text."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, decimal.Decimal):
        return float(v) if v.is_finite() else None
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _series_doc(s: Series, epoch: str | None, tz: str | None, timed: bool, rows: list) -> dict:
    doc: dict = {}
    if s.name is not None:
        doc["name"] = s.name
    if s.tags:
        doc["tags"] = dict(s.tags)
    doc["columns"] = list(s.columns)
    values = []
    for r in rows:
        r = [_value(v) for v in r]
        if timed:
            r[0] = r[0] // EPOCHS[epoch] if epoch else _rfc3339(r[0], tz)
        values.append(r)
    doc["values"] = values
    return doc


def _timed(s: Series) -> bool:
    return bool(s.columns) and s.columns[0] == "time"


def v1_pieces(results: Iterable[StatementResult], epoch: str | None) -> Iterator[bytes]:
    """InfluxDB 1.x's answer of `/query`, {"results": [{"statement_id", "series" | "error"}]}, as
    pieces of the text `json.dumps` makes of it: a series at a time."""
    yield b'{"results": ['
    for k, r in enumerate(results):
        head = b", " if k else b""
        if r.error is not None:
            yield head + json.dumps({"statement_id": r.statement_id, "error": r.error}).encode()
            continue
        series = iter(r.series)
        s = next(series, None)
        if s is None:
            yield head + json.dumps({"statement_id": r.statement_id}).encode()
            continue
        sep = head + b'{"statement_id": ' + json.dumps(r.statement_id).encode() + b', "series": ['
        while s is not None:
            text = json.dumps(_series_doc(s, epoch, r.tz, _timed(s), s.values))
            s = None  # not held while the next series is made
            yield sep + text.encode()
            sep = b", "
            s = next(series, None)
        yield b"]}"
    yield b"]}"


def _chunk_line(statement_id: int, part: str, partial: bool) -> bytes:
    """One line of the chunked answer: `part` (a piece of a series, JSON) of a statement."""
    tail = ', "partial": true' if partial else ""
    return f'{{"results": [{{"statement_id": {json.dumps(statement_id)}, "series": [{part}]{tail}}}]}}\n'.encode()


def v1_chunks(results: Iterable[StatementResult], epoch: str | None, chunk_size: int) -> Iterator[bytes]:
    """1.x's chunked answer: one JSON document per line, each a piece of at most `chunk_size` rows
    of one series, `partial` on every piece but a statement's last (a piece is written once the
    next one of its statement is made, or the statement ended)."""
    for r in results:
        series = iter(r.series) if r.error is None else iter(())
        s = next(series, None)
        if s is None:
            doc = {"statement_id": r.statement_id}
            if r.error is not None:
                doc["error"] = r.error
            yield json.dumps({"results": [doc]}).encode() + b"\n"
            continue
        pending = None  # the JSON of the last piece made, not written yet
        while s is not None:
            rows = s.values
            for i in range(0, max(len(rows), 1), chunk_size):
                part = _series_doc(s, epoch, r.tz, _timed(s), rows[i:i + chunk_size])
                if i + chunk_size < len(rows):
                    part["partial"] = True
                if pending is not None:
                    yield _chunk_line(r.statement_id, pending, True)
                pending = json.dumps(part)
            s = rows = part = None  # not held while the next series is made
            s = next(series, None)
        yield _chunk_line(r.statement_id, pending, False)


#: The rows of a record batch of InfluxDB 3's table (the last one of an answer may have fewer): a
#: larger series is cut, smaller ones are gathered
_V3_BATCH_ROWS = 10_000


class V3Answer:
    """InfluxDB 3's table of one statement's series: `iox::measurement`, then the time (a UTC
    timestamp of nanoseconds) when the series are timed, then the group-by tags, then the columns.
    `schema` is known before the first row; `batches()` streams the rows (read once); `close()`
    stops the statement's queries. A statement without series (or a SHOW statement) answers the
    table of the series it has: without one, only `iox::measurement`."""

    def __init__(self, result: StatementResult):
        self._series = result.series
        self._table = None
        if isinstance(result.series, list) or result.shapes is None:
            self._table = _v3_table(list(result.series))
            self.schema = self._table.schema
            return
        tag_names: list = []
        value_names: list = []
        for shape in result.shapes:
            tag_names += [t for t in shape.tags if t not in tag_names]
            value_names += [c for c in shape.columns if c not in value_names]
        self._tag_names = tag_names
        self._plans: dict = {}  # a series' columns -> where its cells come from (`_sources`)
        # a name twice (a column named as a tag) is one column, where it first comes
        names = list(dict.fromkeys([MEASUREMENT_COLUMN, "time"] + tag_names +
                                   [c for c in value_names if c not in tag_names]))
        fields = []
        for n in names:
            if n == "time":
                fields.append(pa.field(n, pa.timestamp("ns", tz="UTC")))
                continue
            kinds: set = set()
            for shape in result.shapes:
                if n in shape.columns:
                    kinds |= shape.kinds[shape.columns.index(n)]
                elif n in tag_names:
                    kinds |= {"str"} if n in shape.tags else set()
                elif n == MEASUREMENT_COLUMN:
                    kinds.add("str")
            fields.append(pa.field(n, _arrow_type(kinds)))
        self.schema = pa.schema(fields)

    def batches(self) -> Iterator[pa.RecordBatch]:
        if self._table is not None:
            yield from self._table.to_batches()
            return
        series = self._series
        cells = [[] for _ in self.schema]  # per column, the cells of the batch being built
        rows = 0
        s = next(series, None)
        while s is not None:
            sources = self._sources(s)
            off, n = 0, len(s.values)
            while off < n:
                take = min(n - off, _V3_BATCH_ROWS - rows)
                part = s.values[off:off + take]
                for column, source in zip(cells, sources):
                    column += _cells(source, part)
                off, rows = off + take, rows + take
                if rows >= _V3_BATCH_ROWS:
                    yield self._batch(cells)
                    cells, rows = [[] for _ in self.schema], 0
            s = sources = part = None  # not held while the next series is made
            s = next(series, None)
        if rows:
            yield self._batch(cells)

    def _sources(self, s: Series) -> list:
        """Per column, where series `s` has its cells: a column of its own, then a tag, then the time
        and the measurement's name, else none (as the rows of `_v3_table` take them)."""
        plan = self._plans.get(tuple(s.columns))
        if plan is None:  # the same for every series of a measurement
            cols = s.columns[1:] if _timed(s) else s.columns
            first = 1 if _timed(s) else 0
            plan = []
            for f in self.schema:
                if f.name in cols:
                    plan.append(("value", first + cols.index(f.name)))
                elif f.name in self._tag_names:
                    plan.append(("tag", f.name))
                elif f.name == "time" and _timed(s):
                    plan.append(("time", 0))
                elif f.name == MEASUREMENT_COLUMN:
                    plan.append(("name", None))
                else:
                    plan.append(("same", None))
            self._plans[tuple(s.columns)] = plan
        tags = s.tags or {}
        return [("same", tags.get(at)) if kind == "tag" else ("same", s.name) if kind == "name" else (kind, at)
                for kind, at in plan]

    def _batch(self, cells: list) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([_array(c, f.type) for c, f in zip(cells, self.schema)], schema=self.schema)

    def close(self) -> None:
        close = getattr(self._series, "close", None)
        if close is not None:
            close()


def _cells(source: tuple, rows: list) -> list:
    """The cells of `rows` of a series in one column (`source`: `V3Answer._sources`)."""
    kind, at = source
    if kind == "same":
        return [at] * len(rows)
    if kind == "time":
        return [r[0] for r in rows]
    return [_value(r[at]) for r in rows]


def _arrow_type(kinds: set) -> pa.DataType:
    """The Arrow type of a column whose values have `kinds` (as `pa.array` infers it over such
    values: ints and floats together are floats; kinds it cannot hold together are text)."""
    if not kinds:
        return pa.null()
    if kinds == {"bool"}:
        return pa.bool_()
    if kinds == {"int"}:
        return pa.int64()
    if kinds <= {"int", "float"}:
        return pa.float64()
    return pa.string()


def _array(values: list, t: pa.DataType) -> pa.Array:
    """`values` as an array of type `t`, never converted into another kind of value (a float is not
    cut to an int, a bool not made a number): a value `t` does not hold raises (the answer is cut
    off, never wrong)."""
    if pa.types.is_string(t):
        return pa.array([None if v is None else str(v) for v in values], t)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        a = pa.array(values)
        held = (pa.int64(), pa.null()) if pa.types.is_integer(t) else (pa.int64(), pa.float64(), pa.null())
        if a.type not in held:
            raise TypeError(f"a column of {t} would have values of {a.type}")
        return a.cast(t)
    return pa.array(values, t)  # null, bool and the time refuse anything else


def _v3_table(series: list) -> pa.Table:
    """InfluxDB 3's table of series read whole (SHOW's), typed as `pa.array` infers their values."""
    tag_names: list = []
    value_names: list = []
    for s in series:
        for t in (s.tags or {}):
            if t not in tag_names:
                tag_names.append(t)
        for c in s.columns[1:] if _timed(s) else s.columns:
            if c not in value_names:
                value_names.append(c)
    timed = any(_timed(s) for s in series)
    rows = []
    for s in series:
        for r in s.values:
            row = {MEASUREMENT_COLUMN: s.name}
            if timed:
                row["time"] = r[0] if _timed(s) else None
            row.update({t: (s.tags or {}).get(t) for t in tag_names})
            cells = r[1:] if _timed(s) else r
            cols = s.columns[1:] if _timed(s) else s.columns
            row.update({c: _value(v) for c, v in zip(cols, cells)})
            rows.append(row)
    names = [MEASUREMENT_COLUMN] + (["time"] if timed else []) + tag_names + [c for c in value_names if c not in tag_names]
    columns = {}
    for n in names:
        values = [row.get(n) for row in rows]
        if n == "time":
            columns[n] = pa.array(values, pa.timestamp("ns", tz="UTC"))
        else:
            try:
                columns[n] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                columns[n] = pa.array([None if v is None else str(v) for v in values], pa.string())
    if not names or not rows:
        return pa.table({n: pa.array([], pa.timestamp("ns", tz="UTC") if n == "time" else pa.string())
                         for n in names})
    return pa.table(columns)
