"""InfluxQL answers in each protocol's shape: InfluxDB 1.x's JSON of `/query` (whole or chunked),
and InfluxDB 3's table (`/api/v3/query_influxql`, Flight tickets of query_type `influxql`).

Invariant: every statement runs through `QueryService.query` (server/query_service.py; server/query/influxql.py): the token's
scope is checked on each database a statement reads (an `ON db` clause too), and SHOW DATABASES
lists only the databases the token may query.

Where it runs: HTTP worker threads and gRPC handler threads (driver).
"""
from __future__ import annotations

import datetime
import decimal
import json
import math
import time

import pyarrow as pa

from iox_spark.server.api.api_parts import Queries
from iox_spark.server.query.influxql import Series, StatementResult, execute

__all__ = ["AnswerContext", "run", "v1_document", "v1_chunks", "v3_table", "EPOCHS", "MEASUREMENT_COLUMN"]

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

    def run_sql(self, database: str, sql: str) -> pa.Table:
        self._check(database)
        return self.queries.query(database, sql, "", False, deadline_s=self.deadline_s).table

    def tables(self, database: str) -> dict:
        self._check(database)
        return self.queries.table_columns(database)

    def databases(self) -> list:
        return [d for d in self.queries.database_names() if self.scope is None or self.scope.allows("query", d)]


def run(ctx: AnswerContext, database: str, text: str, params: dict | None = None) -> list[StatementResult]:
    """The statements' results (InfluxQLSyntaxError when the text does not parse, or `params` does
    not fit its `$name` placeholders)."""
    return execute(text, database, ctx.run_sql, ctx.tables, ctx.databases, time.time_ns(), params)


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


def v1_document(results: list[StatementResult], epoch: str | None) -> dict:
    """InfluxDB 1.x's answer of `/query`: {"results": [{"statement_id", "series" | "error"}]}."""
    out = []
    for r in results:
        doc: dict = {"statement_id": r.statement_id}
        if r.error is not None:
            doc["error"] = r.error
        elif r.series:
            doc["series"] = [_series_doc(s, epoch, r.tz, _timed(s), s.values) for s in r.series]
        out.append(doc)
    return {"results": out}


def v1_chunks(results: list[StatementResult], epoch: str | None, chunk_size: int):
    """1.x's chunked answer: one JSON document per line, each a piece of at most `chunk_size` rows
    of one series, `partial` on every piece but a statement's last."""
    for r in results:
        if r.error is not None or not r.series:
            doc = {"statement_id": r.statement_id}
            if r.error is not None:
                doc["error"] = r.error
            yield json.dumps({"results": [doc]}).encode() + b"\n"
            continue
        pieces = []
        for s in r.series:
            rows = s.values
            for i in range(0, max(len(rows), 1), chunk_size):
                part = _series_doc(s, epoch, r.tz, _timed(s), rows[i:i + chunk_size])
                if i + chunk_size < len(rows):
                    part["partial"] = True
                pieces.append(part)
        for k, part in enumerate(pieces):
            doc = {"statement_id": r.statement_id, "series": [part]}
            if k < len(pieces) - 1:
                doc["partial"] = True
            yield json.dumps({"results": [doc]}).encode() + b"\n"


def v3_table(result: StatementResult) -> pa.Table:
    """InfluxDB 3's table of one statement's series: `iox::measurement`, then the time (a UTC
    timestamp of nanoseconds) when the series are timed, then the group-by tags, then the columns."""
    tag_names: list = []
    value_names: list = []
    for s in result.series:
        for t in (s.tags or {}):
            if t not in tag_names:
                tag_names.append(t)
        for c in s.columns[1:] if _timed(s) else s.columns:
            if c not in value_names:
                value_names.append(c)
    timed = any(_timed(s) for s in result.series)
    rows = []
    for s in result.series:
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
