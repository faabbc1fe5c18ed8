"""InfluxQL answered over the same tables as SQL: each statement is translated to Spark SQL, run by
the query path (the read barrier, the sandbox, retention and limits apply), and its rows are
shaped into InfluxDB 1.x's series.

Invariants:
- A SELECT reads only through `run_sql` (server/query_service.py `QueryService.query`): the same rows a SQL query sees.
  Per measurement, Spark filters (WHERE: time bounds on `time_ns`, tags as InfluxDB compares them,
  a missing tag being ''), groups (GROUP BY time(interval[, offset]) buckets of `time_ns`, tags) and
  aggregates; then, per series (one per group-by tag set, in tag order): fill() of the buckets of
  the time range, transformations (derivative, non_negative_derivative, difference,
  non_negative_difference, moving_average, cumulative_sum) over the aggregated or raw values,
  ORDER BY time DESC, OFFSET/LIMIT; then SOFFSET/SLIMIT over the series.
- Series come in InfluxDB's order: by measurement name, then by their tags (the values in the
  order of the tag names), the rows of a series by time. A SELECT's answer streams (`stream`):
  each measurement's query is ordered by its series key (its group-by tags in tag-name order, then
  the time), so a series is complete when the key changes, and is read batch by batch; at most one
  series of a statement is held as Python objects (two or more only while measurements of one
  name, a table and a subquery of it, are merged), plus the batch being read. The
  measurements' queries are all planned (`run_sql`: the read barrier, the cut, Spark's analysis)
  before a statement's first series is made, then read one after another; a statement's first
  series is made before the statement is answered, so what fails until then is the statement's
  `error`; what fails later ends the stream (the caller cuts its answer off).
- Aggregates are InfluxDB's: mean, median, count, sum, min, max, first, last, spread, stddev
  (sample), percentile (nearest rank), mode-free. A lone selector (first, last, min, max) without
  GROUP BY time answers the time of its point; any other aggregate the start of its bucket or of
  the time range (0 without a lower bound).
- The time range of GROUP BY time is the WHERE clause's top-level `time` bounds; without an upper
  bound it ends at `now_ns`; without a lower bound it runs from the first bucket with data to the
  last (or to the upper bound).
- A subquery (`FROM (SELECT ...)`) is nested in the outer query's SQL: its group-by tags are the
  outer query's tags, its columns the outer query's fields, its buckets' (or points') times the
  outer query's times; its fill() does not apply (the outer query sees its buckets with data), its
  transformations are Spark window functions over each series in time order, and a subquery with
  ORDER BY, LIMIT, OFFSET, SLIMIT or SOFFSET is refused.
- What this server does not answer (INTO, aggregates mixed with raw fields, an unknown function)
  is an error of that statement in the result, never a wrong answer.

Pure apart from `run_sql`, `tables` and `databases`, the callables the caller passes; no clock:
`now_ns` comes in. Who calls it: server/api (the 1.x `/query`, `/api/v3/query_influxql`, Flight
tickets of query_type influxql) on handler threads (driver).
"""
from __future__ import annotations

import datetime
import heapq
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
import pyarrow.compute as pc

from iox_spark.server.query.influxql_parse import (TIME, Binary, BoolLit, Call, DurationLit, Ident, InfluxQLSyntaxError,
                                         Now, NumberLit, RegexLit, Select, Show, StringLit, Wildcard, parse)
from iox_spark.server.errors import ServerError
from iox_spark.server.query.params import sql_literal

__all__ = ["Series", "SeriesShape", "StatementResult", "InfluxQLError", "execute", "stream", "parse_time_ns",
           "FIELD_TYPES", "InfluxQLSyntaxError", "parse"]

#: InfluxDB 1.x's names of the field types (SHOW FIELD KEYS)
FIELD_TYPES = {"float": "float", "integer": "integer", "uinteger": "unsigned", "string": "string",
               "boolean": "boolean"}
_AGGREGATES = {"mean", "median", "count", "sum", "min", "max", "first", "last", "spread", "stddev", "percentile"}
_SELECTORS = {"first", "last", "min", "max"}
_TRANSFORMS = {"derivative", "non_negative_derivative", "difference", "non_negative_difference", "moving_average",
               "cumulative_sum"}


class InfluxQLError(ValueError):
    """A statement this server does not answer, or cannot answer as written: the error of that
    statement in the result (InfluxDB 1.x's per-statement `error`)."""


@dataclass
class Series:
    name: str | None
    columns: list
    values: list  # rows; the first column is the time (int nanoseconds) in a SELECT's series
    tags: dict | None = None


@dataclass
class SeriesShape:
    """What the series of one measurement of a SELECT may hold, known before any of its rows is
    read: `name`, its group-by `tags` (names), its `columns` (names, after `time`) and, per column,
    `kinds`: the Python types its values may have (a frozenset of "bool", "int", "float", "str";
    empty when it holds nulls only), from the query's Arrow types, fill() and the transformations."""

    name: str
    tags: list
    columns: list
    kinds: list


@dataclass
class StatementResult:
    statement_id: int
    #: a list (`execute`, SHOW, a SELECT without series) or a SELECT's series streamed (`stream`): an
    #: iterator read once, `close()` stops it
    series: Iterable = field(default_factory=list)
    error: str | None = None
    tz: str | None = None  # a SELECT's tz(): how its times are written
    #: a SELECT's SeriesShape per measurement, in the order of its series (None: SHOW, or an error)
    shapes: list | None = None


def parse_time_ns(text: str) -> int:
    """Nanoseconds since the epoch of an InfluxQL time string (RFC 3339, a date, or
    `YYYY-MM-DD HH:MM:SS[.fff]`, UTC unless it names an offset); InfluxQLError when it is none."""
    s = text.strip().replace(" ", "T", 1)
    frac_ns = 0
    m = re.match(r"^(\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}:\d{2})?)(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})?$", s)
    if m is None:
        raise InfluxQLError(f"invalid time {text!r}: give RFC 3339 (2006-01-02T15:04:05Z), a date or an integer")
    base, frac, zone = m.groups()
    if frac:
        frac_ns = int(frac.ljust(9, "0"))
    try:
        dt = datetime.datetime.fromisoformat(base + ("+00:00" if zone in (None, "Z") else zone))
    except ValueError as e:
        raise InfluxQLError(f"invalid time {text!r}: {e}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    delta = dt - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000 + frac_ns


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass
class _Schema:
    tags: list
    fields: dict  # name -> type

    def role(self, ident: Ident) -> str | None:
        if ident.cast == "tag":
            return "tag" if ident.name in self.tags else None
        if ident.cast == "field":
            return "field" if ident.name in self.fields else None
        if ident.name in self.fields:
            return "field"
        if ident.name in self.tags:
            return "tag"
        return None


def _time_value(expr, now_ns: int) -> int:
    """The nanoseconds a time comparison's other side stands for."""
    if isinstance(expr, StringLit):
        return parse_time_ns(expr.value)
    if isinstance(expr, NumberLit) and isinstance(expr.value, int):
        return expr.value
    if isinstance(expr, NumberLit):
        return int(expr.value)
    if isinstance(expr, DurationLit):
        return expr.ns
    if isinstance(expr, Now):
        return now_ns
    if isinstance(expr, Binary) and expr.op in ("+", "-"):
        left, right = _time_value(expr.left, now_ns), _time_value(expr.right, now_ns)
        return left + right if expr.op == "+" else left - right
    raise InfluxQLError("invalid time comparison: compare time with now(), a duration, an RFC 3339 string "
                        "or an integer of nanoseconds")


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}


def _time_side(expr: Binary):
    """(op, other side) of a comparison of `time`, written as `time op other`; None when it is not one."""
    if isinstance(expr.left, Ident) and expr.left.name.lower() == TIME:
        return expr.op, expr.right
    if isinstance(expr.right, Ident) and expr.right.name.lower() == TIME:
        return _FLIP.get(expr.op, expr.op), expr.left
    return None


def _time_range(cond, now_ns: int) -> tuple[int | None, int | None]:
    """(lo_inclusive, hi_inclusive) nanoseconds of the top-level AND-ed time bounds of `cond`."""
    lo = hi = None
    stack = [cond] if cond is not None else []
    while stack:
        e = stack.pop()
        if isinstance(e, Binary) and e.op == "AND":
            stack += [e.left, e.right]
            continue
        if isinstance(e, Binary) and e.op in _FLIP:
            side = _time_side(e)
            if side is None:
                continue
            op, value = side[0], _time_value(side[1], now_ns)
            if op in (">", ">=", "="):
                v = value + (1 if op == ">" else 0)
                lo = v if lo is None else max(lo, v)
            if op in ("<", "<=", "="):
                v = value - (1 if op == "<" else 0)
                hi = v if hi is None else min(hi, v)
    return lo, hi


class _Translator:
    """InfluxQL expressions of one measurement as Spark SQL."""

    def __init__(self, schema: _Schema, now_ns: int):
        self.schema, self.now_ns = schema, now_ns

    def cond(self, e) -> str:
        if isinstance(e, Binary) and e.op in ("AND", "OR"):
            return f"({self.cond(e.left)}) {e.op} ({self.cond(e.right)})"
        if isinstance(e, Binary) and e.op in _FLIP:
            side = _time_side(e)
            if side is not None:
                op = "!=" if side[0] == "!=" else side[0]
                return f"time_ns {op} {_time_value(side[1], self.now_ns)}"
        if isinstance(e, Binary) and e.op in ("=~", "!~"):
            left = self._text(e.left)
            rx = sql_literal(e.right.pattern)
            return f"{'NOT ' if e.op == '!~' else ''}({left} RLIKE {rx})"
        if isinstance(e, Binary) and e.op in _FLIP:
            string_side = isinstance(e.left, StringLit) or isinstance(e.right, StringLit)
            left = self._text(e.left) if string_side else self.value(e.left)
            right = self._text(e.right) if string_side else self.value(e.right)
            return f"{left} {e.op} {right}"
        if isinstance(e, BoolLit):
            return "TRUE" if e.value else "FALSE"
        raise InfluxQLError(f"invalid condition: {e}")

    def _text(self, e) -> str:
        """A tag or a string as InfluxDB compares it: a missing tag is ''."""
        if isinstance(e, Ident):
            role = self.schema.role(e)
            if role == "tag":
                return f"coalesce({_q(e.name)}, '')"
            if role == "field":
                return _q(e.name)
            return "''"  # an unknown name: missing everywhere
        return self.value(e)

    def value(self, e) -> str:
        if isinstance(e, Ident):
            if e.name.lower() == TIME:
                return "time_ns"
            return _q(e.name) if self.schema.role(e) is not None else "NULL"
        if isinstance(e, StringLit):
            return sql_literal(e.value)
        if isinstance(e, NumberLit):
            return sql_literal(e.value)
        if isinstance(e, BoolLit):
            return "TRUE" if e.value else "FALSE"
        if isinstance(e, DurationLit):
            return str(e.ns)
        if isinstance(e, Binary) and e.op in ("+", "-", "*", "/", "%"):
            op = e.op
            if op == "/":
                return f"(CAST({self.value(e.left)} AS DOUBLE) / {self.value(e.right)})"
            return f"({self.value(e.left)} {op} {self.value(e.right)})"
        if isinstance(e, Call) and e.name in _AGGREGATES:
            return self.aggregate(e)
        raise InfluxQLError(f"unsupported expression {e}")

    def aggregate(self, call: Call) -> str:
        if not call.args or not isinstance(call.args[0], Ident):
            raise InfluxQLError(f"expected field argument in {call.name}()")
        f = call.args[0]
        if self.schema.role(f) != "field":
            x = "NULL"  # a tag or an unknown name: aggregates of fields only; no value
        else:
            x = _q(f.name)
        n = call.name
        if n == "percentile":
            if len(call.args) != 2 or not isinstance(call.args[1], NumberLit):
                raise InfluxQLError("expected percentile(field, N)")
            p = float(call.args[1].value)
            return (f"get(array_sort(collect_list({x})), CAST(floor({p!r} / 100.0 * count({x}) + 0.5) AS INT) - 1)")
        if len(call.args) != 1:
            raise InfluxQLError(f"invalid number of arguments for {n}, expected 1, got {len(call.args)}")
        return {"mean": f"avg({x})", "median": f"median({x})", "count": f"count({x})", "sum": f"sum({x})",
                "min": f"min({x})", "max": f"max({x})", "spread": f"max({x}) - min({x})",
                "stddev": f"stddev_samp({x})",
                "first": f"min_by({x}, CASE WHEN {x} IS NOT NULL THEN time_ns END)",
                "last": f"max_by({x}, CASE WHEN {x} IS NOT NULL THEN time_ns END)"}[n]

    def selector_time(self, call: Call) -> str | None:
        """SQL of the time of a lone selector's point."""
        if call.name not in _SELECTORS or not call.args or not isinstance(call.args[0], Ident) \
                or self.schema.role(call.args[0]) != "field":
            return None
        x = _q(call.args[0].name)
        return {"first": f"min(CASE WHEN {x} IS NOT NULL THEN time_ns END)",
                "last": f"max(CASE WHEN {x} IS NOT NULL THEN time_ns END)",
                "min": f"min_by(time_ns, {x})", "max": f"max_by(time_ns, {x})"}[call.name]


def _has_aggregate(e) -> bool:
    if isinstance(e, Call):
        return e.name in _AGGREGATES or any(_has_aggregate(a) for a in e.args)
    if isinstance(e, Binary):
        return _has_aggregate(e.left) or _has_aggregate(e.right)
    return False


def _bare_fields(e) -> bool:
    """Whether `e` reads a column outside of any aggregate."""
    if isinstance(e, Ident):
        return True
    if isinstance(e, Call):
        if e.name in _AGGREGATES:
            return False
        return any(_bare_fields(a) for a in e.args if not isinstance(a, (DurationLit, NumberLit)))
    if isinstance(e, Binary):
        return _bare_fields(e.left) or _bare_fields(e.right)
    return False


def _name_of(e) -> str:
    if isinstance(e, Ident):
        return e.name
    if isinstance(e, Call):
        return e.name
    if isinstance(e, Binary):
        parts = [p for p in (_name_of(e.left), _name_of(e.right)) if p]
        return "_".join(parts)
    return ""


@dataclass
class _Column:
    name: str
    expr: object  # the InfluxQL expression computed in SQL (the inner one of a transformation)
    transform: Call | None = None


def _columns(st: Select, schema: _Schema) -> list[_Column]:
    out, seen = [], {}
    for f in st.fields:
        exprs = [f.expr]
        if isinstance(f.expr, Wildcard):
            kinds = {"field": sorted(schema.fields), "tag": sorted(schema.tags)}
            names = kinds.get(f.expr.kind) or sorted(list(schema.fields) + list(schema.tags))
            exprs = [Ident(n) for n in names]
        for e in exprs:
            transform = None
            if isinstance(e, Call) and e.name in _TRANSFORMS:
                if not e.args:
                    raise InfluxQLError(f"invalid number of arguments for {e.name}")
                transform, e = e, e.args[0]
            elif isinstance(e, Call) and e.name not in _AGGREGATES:
                raise InfluxQLError(f"undefined function {e.name}()")
            name = f.alias or (transform.name if transform is not None else _name_of(e)) or "expr"
            if name in seen:
                seen[name] += 1
                name = f"{name}_{seen[name]}"
            else:
                seen[name] = 0
            out.append(_Column(name, e, transform))
    return out


def _transformed(values: list, times: list, call: Call) -> tuple[list, list]:
    """(times, values) of a transformation over one column's values (nulls skipped)."""
    points = [(t, v) for t, v in zip(times, values) if v is not None]
    n = call.name
    if n in ("derivative", "non_negative_derivative"):
        unit = call.args[1].ns if len(call.args) > 1 and isinstance(call.args[1], DurationLit) else 1_000_000_000
        out = []
        for (t0, v0), (t1, v1) in zip(points, points[1:]):
            if t1 == t0:
                continue
            d = (v1 - v0) / ((t1 - t0) / unit)
            if n == "derivative" or d >= 0:
                out.append((t1, d))
    elif n in ("difference", "non_negative_difference"):
        out = [(t1, v1 - v0) for (_t0, v0), (t1, v1) in zip(points, points[1:])
               if n == "difference" or v1 - v0 >= 0]
    elif n == "moving_average":
        if len(call.args) != 2 or not isinstance(call.args[1], NumberLit) or int(call.args[1].value) < 1:
            raise InfluxQLError("moving_average window must be greater than 1")
        w = int(call.args[1].value)
        out = [(points[i][0], sum(v for _t, v in points[i - w + 1:i + 1]) / w) for i in range(w - 1, len(points))]
    else:  # cumulative_sum
        total, out = 0, []
        for t, v in points:
            total += v
            out.append((t, total))
    return [t for t, _v in out], [v for _t, v in out]


def _filled(rows: dict, buckets: list, ncols: int, fill) -> list:
    """[[time, v...]] of every bucket: rows where there are some, else filled as `fill` says."""
    out = []
    for b in buckets:
        r = rows.get(b)
        if r is not None:
            out.append([b] + list(r))
        elif fill == "none":
            continue
        elif fill in ("null", "previous", "linear"):
            out.append([b] + [None] * ncols)
        else:
            out.append([b] + [fill] * ncols)
    if fill == "previous":
        last = [None] * ncols
        for r in out:
            for i in range(ncols):
                if r[i + 1] is None:
                    r[i + 1] = last[i]
                else:
                    last[i] = r[i + 1]
    elif fill == "linear":
        for i in range(ncols):
            known = [(k, r[0], r[i + 1]) for k, r in enumerate(out) if r[i + 1] is not None]
            for (k0, t0, v0), (k1, t1, v1) in zip(known, known[1:]):
                if not (isinstance(v0, (int, float)) and isinstance(v1, (int, float))):
                    continue
                for k in range(k0 + 1, k1):
                    out[k][i + 1] = v0 + (v1 - v0) * (out[k][0] - t0) / (t1 - t0)
    return out


def _sources(st: Select, tables: dict, now_ns: int) -> list[tuple[str, str, list]]:
    """(measurement, FROM clause SQL, [(column, role, type)]) of each source of `st`: a table, the
    tables a regex matches, or a subquery (its SQL nested: its group-by tags are the outer query's
    tags, its columns its fields)."""
    out = []
    for s in st.sources:
        if s.regex is not None:
            try:
                rx = re.compile(s.regex)
            except re.error as e:
                raise InfluxQLError(f"invalid regex /{s.regex}/: {e}") from None
            out += [(t, _q(t), tables[t]) for t in sorted(tables) if rx.search(t)]
        elif s.name is not None:
            if s.name in tables:
                out.append((s.name, _q(s.name), tables[s.name]))
        else:
            out += _subquery(s.subquery, tables, now_ns)
    seen, unique = set(), []
    for src in out:
        if src[:2] not in seen:
            seen.add(src[:2])
            unique.append(src)
    return unique


def _subquery(inner: Select, tables: dict, now_ns: int) -> list[tuple[str, str, list]]:
    if inner.order_desc or inner.limit or inner.offset or inner.slimit or inner.soffset:
        raise InfluxQLError("ORDER BY, LIMIT, OFFSET, SLIMIT and SOFFSET in a subquery are not supported")
    out = []
    for measurement, from_sql, columns in _sources(inner, tables, now_ns):
        plan = _plan(inner, from_sql, columns, now_ns)
        names = [c.name for c in plan.cols]
        tags = [t for t in plan.group_tags if t not in names]
        keep = "__n > 0" if plan.aggregate else \
            " OR ".join(f"__c{i} IS NOT NULL" for i in plan.field_cols) or "TRUE"
        rows_sql = f"SELECT * FROM ({plan.sql}) WHERE {keep}"
        transformed = [i for i, c in enumerate(plan.cols) if c.transform is not None]
        if transformed:  # computed over each series' rows in time order, as Spark window functions
            if not plan.aggregate:
                rows_sql += "".join(f" AND __c{i} IS NOT NULL" for i in transformed)
            w = (f"PARTITION BY {', '.join(f'__g{i}' for i in range(len(plan.group_tags)))} "
                 if plan.group_tags else "") + "ORDER BY __t"
            values = [_window_sql(c.transform, f"__c{i}", w) if c.transform is not None else f"__c{i}"
                      for i, c in enumerate(plan.cols)]
            rows_sql = (f"SELECT * FROM (SELECT __t, {', '.join(f'__g{i}' for i in range(len(plan.group_tags)))}"
                        f"{', ' if plan.group_tags else ''}{', '.join(f'{v} AS __c{i}' for i, v in enumerate(values))} "
                        f"FROM ({rows_sql})) WHERE {' OR '.join(f'__c{i} IS NOT NULL' for i in transformed)}")
        select = ["__t AS time_ns"] + [f"__g{i} AS {_q(t)}" for i, t in enumerate(plan.group_tags) if t in tags] + \
            [f"__c{i} AS {_q(n)}" for i, n in enumerate(names)]
        sql = f"(SELECT {', '.join(select)} FROM ({rows_sql}))"
        cols = [(t, "tag", "string") for t in tags] + [(n, "field", "float") for n in names]
        out.append((measurement, sql, cols))
    return out


def _window_sql(call: Call, v: str, w: str) -> str:
    """A transformation of column `v` over the window `w` (a series in time order, `__t` its time),
    as `_transformed` computes it: NULL where it has no value (the first rows, a negative rate of a
    non_negative_ one, a moving average's first window - 1 rows)."""
    n = call.name
    if n in ("derivative", "non_negative_derivative"):
        unit = call.args[1].ns if len(call.args) > 1 and isinstance(call.args[1], DurationLit) else 1_000_000_000
        d = f"(CAST({v} - lag({v}) OVER ({w}) AS DOUBLE) / ((__t - lag(__t) OVER ({w})) / {unit}D))"
    elif n in ("difference", "non_negative_difference"):
        d = f"({v} - lag({v}) OVER ({w}))"
    elif n == "moving_average":
        if len(call.args) != 2 or not isinstance(call.args[1], NumberLit) or int(call.args[1].value) < 1:
            raise InfluxQLError("moving_average window must be greater than 1")
        k = int(call.args[1].value)
        frame = f"{w} ROWS BETWEEN {k - 1} PRECEDING AND CURRENT ROW"
        return f"CASE WHEN count({v}) OVER ({frame}) = {k} THEN avg({v}) OVER ({frame}) END"
    else:  # cumulative_sum
        return f"sum({v}) OVER ({w} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    return f"CASE WHEN {d} >= 0 THEN {d} END" if n.startswith("non_negative") else d


def _select(st: Select, run_sql, tables: dict, now_ns: int) -> tuple[list, Iterator[Series]]:
    """(SeriesShape per measurement, the statement's series as a generator). Every measurement is
    planned and its query opened here (errors raise before any series); the generator reads the
    queries one after another and closes them all when it ends or is closed."""
    # measurements in name order; those of one name (a table and a subquery of it) in FROM's order
    sources = sorted(_sources(st, tables, now_ns), key=lambda src: src[0])
    plans = [(measurement, _plan(st, from_sql, columns, now_ns)) for measurement, from_sql, columns in sources]
    opened: list = []
    try:
        for _measurement, p in plans:
            opened.append(run_sql(_ordered_sql(p)))
        shapes = [SeriesShape(m, list(p.group_tags), [c.name for c in p.cols], _kinds(st, p, r.schema))
                  for (m, p), r in zip(plans, opened)]
    except BaseException:
        for r in opened:
            _close(r)
        raise
    return shapes, _series_stream(st, plans, opened, now_ns)


def _series_stream(st: Select, plans: list, opened: list, now_ns: int) -> Iterator[Series]:
    """The series of `plans` (sorted by measurement name), each read from its opened query, after
    SOFFSET and up to SLIMIT; measurements of one name merged in tag order (FROM's order on a tie)."""
    readers: list = []

    def in_order():
        for _name, members in itertools.groupby(zip(plans, opened), key=lambda pr: pr[0][0]):
            streams = [_select_one(st, m, p, r, now_ns) for (m, p), r in members]
            readers.extend(streams)
            if len(streams) == 1:
                yield from streams[0]
            else:
                yield from heapq.merge(*streams, key=lambda s: sorted((s.tags or {}).items()))

    try:
        yield from itertools.islice(in_order(), st.soffset, st.soffset + st.slimit if st.slimit else None)
    finally:
        for g in readers:
            g.close()
        for r in opened:
            _close(r)


def _close(obj) -> None:
    """Closes a query's result or a generator (nothing for a pa.Table)."""
    close = getattr(obj, "close", None)
    if close is not None:
        close()


def _table_of(got) -> pa.Table:
    """The whole table of what `run_sql` answered (a pa.Table, or a QueryResult read through)."""
    return got if isinstance(got, pa.Table) else got.table


def _ordered_sql(p: _Plan) -> str:
    """`p`'s query with its rows in series order: its group-by tags in tag-name order, then the time
    (Spark orders strings by their UTF-8 bytes: Python's order of str)."""
    keys = [f"__g{i}" for i in sorted(range(len(p.group_tags)), key=lambda i: p.group_tags[i])] + ["__t"]
    names = ["__t"] + [f"__g{i}" for i in range(len(p.group_tags))] + [f"__c{i}" for i in range(len(p.cols))] + \
        (["__n"] if p.aggregate else [])
    return f"SELECT {', '.join(names)} FROM ({p.sql}) ORDER BY {', '.join(keys)}"


def _type_kinds(t: pa.DataType) -> set:
    """The Python types of a column's values (as `_value` of server/api/influxql_answer.py leaves
    them): decimals become floats, anything that is not a JSON scalar text."""
    if pa.types.is_null(t):
        return set()
    if pa.types.is_boolean(t):
        return {"bool"}
    if pa.types.is_integer(t):
        return {"int"}
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return {"float"}
    return {"str"}


def _kinds(st: Select, p: _Plan, schema: pa.Schema) -> list:
    """Per column of `p`, the kinds of its values (SeriesShape): its query's Arrow type, then what
    fill() adds (a number: its own; linear: floats between numbers), then what a transformation
    makes of them (a rate or an average: floats; a difference or a sum: the numbers' own)."""
    out = []
    for i, c in enumerate(p.cols):
        k = schema.get_field_index(f"__c{i}")
        kinds = _type_kinds(schema.field(k).type) if k >= 0 else set()
        if p.aggregate and p.interval is not None:
            if st.fill == "linear" and kinds & {"bool", "int", "float"}:
                kinds.add("float")
            elif not isinstance(st.fill, str):
                kinds.add("float" if isinstance(st.fill, float) else "int")
        if c.transform is not None:
            if c.transform.name in ("derivative", "non_negative_derivative", "moving_average"):
                kinds = {"float"} if kinds else set()
            else:
                kinds = {"int" if x == "bool" else x for x in kinds}
        out.append(frozenset(kinds))
    return out


@dataclass
class _Plan:
    """One measurement's SQL of a SELECT and what shapes its rows."""

    sql: str
    cols: list
    group_tags: list
    aggregate: bool
    interval: int | None
    offset: int
    tz_offset: int
    lo: int | None
    hi: int | None
    field_cols: list  # indexes of the columns that are not tags


def _plan(st: Select, from_sql: str, columns: list, now_ns: int) -> _Plan:
    schema = _Schema(tags=[c for c, role, _t in columns if role == "tag"],
                     fields={c: t for c, role, t in columns if role == "field"})
    tr = _Translator(schema, now_ns)
    cols = _columns(st, schema)
    aggregate = any(_has_aggregate(c.expr) for c in cols)
    if aggregate and any(_bare_fields(c.expr) for c in cols):
        raise InfluxQLError("mixing aggregate and non-aggregate queries is not supported")
    interval = None
    offset = 0
    group_tags: list = []
    for d in st.dimensions:
        if isinstance(d, Call) and d.name == "time":
            if not d.args or not isinstance(d.args[0], DurationLit) or d.args[0].ns <= 0:
                raise InfluxQLError("time dimension expected a positive duration")
            interval = d.args[0].ns
            if len(d.args) > 1:
                if isinstance(d.args[1], DurationLit):
                    offset = d.args[1].ns
                elif isinstance(d.args[1], Now):
                    offset = now_ns
                else:
                    raise InfluxQLError("time dimension offset must be a duration or now()")
        elif isinstance(d, Ident):
            group_tags.append(d.name)
        elif isinstance(d, Wildcard):
            group_tags += schema.tags
        elif isinstance(d, RegexLit):
            group_tags += [t for t in schema.tags if re.search(d.pattern, t)]
        else:
            raise InfluxQLError(f"only time() and tag dimensions allowed, got {d}")
    if interval is not None and not aggregate:
        raise InfluxQLError("GROUP BY requires at least one aggregate function")
    group_tags = list(dict.fromkeys(group_tags))
    lo, hi = _time_range(st.condition, now_ns)
    tz_offset = 0
    if st.tz:
        try:
            zone = ZoneInfo(st.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InfluxQLError(f"unable to find time zone {st.tz}") from None
        at = datetime.datetime.fromtimestamp(((lo if lo is not None else now_ns) // 10**9), tz=datetime.timezone.utc)
        tz_offset = int(zone.utcoffset(at.replace(tzinfo=None)).total_seconds()) * 10**9
    where = f" WHERE {tr.cond(st.condition)}" if st.condition is not None else ""
    tag_sql = [f"coalesce({_q(t)}, '') AS __g{i}" if t in schema.tags else f"'' AS __g{i}"
               for i, t in enumerate(group_tags)]
    value_sql = [f"{tr.value(c.expr)} AS __c{i}" for i, c in enumerate(cols)]
    if aggregate:
        if interval is not None:
            off = (offset - tz_offset) % interval
            t_sql = f"time_ns - pmod(time_ns - {off}, {interval})"
        else:
            lone = [c for c in cols if isinstance(c.expr, Call) and c.transform is None]
            sel = tr.selector_time(lone[0].expr) if len(cols) == 1 and lone else None
            t_sql = sel if sel is not None else str(lo if lo is not None else 0)
            if sel is None:
                t_sql = f"{t_sql} + 0 * count(*)"  # a constant beside the aggregates
        group = ", ".join(str(k) for k in range(1, 2 + len(group_tags))) if interval is not None else \
            ", ".join(str(k) for k in range(2, 2 + len(group_tags)))
        sql = (f"SELECT {t_sql} AS __t, {', '.join(tag_sql + value_sql + ['count(*) AS __n'])} "
               f"FROM {from_sql}{where}" + (f" GROUP BY {group}" if group else ""))
    else:
        sql = f"SELECT time_ns AS __t, {', '.join(tag_sql + value_sql)} FROM {from_sql}{where}"
    field_cols = [i for i, c in enumerate(cols) if not (isinstance(c.expr, Ident) and schema.role(c.expr) == "tag")]
    return _Plan(sql, cols, group_tags, aggregate, interval, offset, tz_offset, lo, hi, field_cols)


def _select_one(st: Select, measurement: str, p: _Plan, result, now_ns: int) -> Iterator[Series]:
    """The series of one measurement, in tag order, each made once its last row was read (the
    query's rows come in series order, `_ordered_sql`); `result`: what `run_sql` answered."""
    batches = iter(result.to_batches()) if isinstance(result, pa.Table) else result.batches()
    order = sorted(range(len(p.group_tags)), key=lambda i: p.group_tags[i])
    key = rank = None
    points: list = []
    try:
        for b in batches:
            values = _values_of(b, p)
            for k, start, end in _runs(b, len(p.group_tags)):
                if k != key:
                    k_rank = tuple(k[i] for i in order)
                    if rank is not None and k_rank <= rank:  # never a series split in two
                        raise RuntimeError(f"the rows of {measurement!r} did not come in series order")
                    if key is not None:
                        done = _series_of(st, measurement, p, key, points, now_ns)
                        points = []
                        if done is not None:
                            yield done
                            done = None
                    key, rank = k, k_rank
                points += _points(values, start, end, p)
            values = None
        if key is not None:
            done = _series_of(st, measurement, p, key, points, now_ns)
            points = []
            if done is not None:
                yield done
    finally:
        _close(batches)


def _runs(b: pa.RecordBatch, ngroups: int):
    """(key, start, end) of each run of rows of `b` with one group-by key (its `__g` values)."""
    n = b.num_rows
    if n == 0:
        return
    if not ngroups:
        yield (), 0, n
        return
    cols = [b.column(f"__g{i}") for i in range(ngroups)]
    starts = [0]
    if n > 1:
        changed = None
        for c in cols:
            d = pc.not_equal(c.slice(1), c.slice(0, n - 1))
            changed = d if changed is None else pc.or_(changed, d)
        starts += [i + 1 for i in pc.indices_nonzero(changed).to_pylist()]
    for start, end in zip(starts, starts[1:] + [n]):
        yield tuple(c[start].as_py() for c in cols), start, end


def _values_of(b: pa.RecordBatch, p: _Plan) -> tuple:
    """(times, [values per column], row counts or None) of batch `b`, as Python lists."""
    return (b.column("__t").to_pylist(), [b.column(f"__c{i}").to_pylist() for i in range(len(p.cols))],
            b.column("__n").to_pylist() if p.aggregate else None)


def _points(values: tuple, start: int, end: int, p: _Plan) -> list:
    """[(time, [values])] of rows `start` to `end` of a batch (`_values_of`), of one series: an
    aggregate's buckets without rows and raw points without any of the selected fields left out."""
    ts, cs, ns = values
    out = []
    for r in range(start, end):
        if ns is not None and ns[r] == 0:
            continue
        vals = [c[r] for c in cs]
        if ns is None and p.field_cols and all(vals[i] is None for i in p.field_cols):
            continue  # a point without any of the selected fields
        out.append((ts[r], vals))
    return out


def _series_of(st: Select, measurement: str, p: _Plan, key: tuple, points: list, now_ns: int) -> Series | None:
    """The series of one group-by key from its points (None when nothing of it is left)."""
    if not points:
        return None
    cols, interval, offset, tz_offset, lo, hi = p.cols, p.interval, p.offset, p.tz_offset, p.lo, p.hi
    points.sort(key=lambda pt: pt[0])  # in time order already (a stable sort: ties keep the query's order)
    if p.aggregate and interval is not None:
        first = points[0][0]
        start = first if lo is None else lo - (lo - (offset - tz_offset) % interval) % interval
        # without a lower bound the buckets are those from the first with data to the last (or
        # the upper bound); with one and no upper bound, up to now, as InfluxDB does
        end = hi if hi is not None else (now_ns if lo is not None else points[-1][0])
        if lo is None:
            start = first
        buckets = list(range(start, max(end, points[-1][0]) + 1, interval)) if st.fill != "none" else \
            [t for t, _v in points]
        if len(buckets) > 1_000_000:
            raise InfluxQLError(f"GROUP BY time({interval}ns) over this time range makes {len(buckets)} buckets: "
                                f"give a narrower time range, a larger interval or fill(none)")
        rows = _filled({t: v for t, v in points}, buckets, len(cols), st.fill)
    else:
        rows = [[t] + v for t, v in points]
    if any(c.transform is not None for c in cols):
        rows = _apply_transforms(rows, cols)
    if st.order_desc:
        rows.reverse()
    if st.offset:
        rows = rows[st.offset:]
    if st.limit:
        rows = rows[:st.limit]
    if not rows:
        return None
    tags = dict(zip(p.group_tags, key)) if p.group_tags else None
    return Series(measurement, [TIME] + [c.name for c in cols], rows, tags)


def _apply_transforms(rows: list, cols: list) -> list:
    """Rows after each column's transformation (a transformed column keeps the times it answers;
    the other columns the values at those times)."""
    times = [r[0] for r in rows]
    by_time: dict = {}
    for i, c in enumerate(cols):
        values = [r[i + 1] for r in rows]
        if c.transform is not None:
            ts, vs = _transformed(values, times, c.transform)
            for t, v in zip(ts, vs):
                by_time.setdefault(t, [None] * len(cols))[i] = v
    for i, c in enumerate(cols):
        if c.transform is None:
            for r in rows:
                if r[0] in by_time:
                    by_time[r[0]][i] = r[i + 1]
    return [[t] + v for t, v in sorted(by_time.items())]


def _show(st: Show, database: str, run_sql, tables: dict, databases) -> list[Series]:
    if st.what == "databases":
        return [Series("databases", ["name"], [[d] for d in databases()])]
    if st.what == "retention policies":
        return [Series(None, ["name", "duration", "shardGroupDuration", "replicaN", "default"],
                       [["autogen", "0s", "168h0m0s", 1, True]])]
    names = sorted(tables)
    if st.sources:
        wanted = set()
        for s in st.sources:
            if s.regex is not None:
                wanted |= {t for t in names if re.search(s.regex, t)}
            elif s.name is not None:
                wanted.add(s.name)
        names = [t for t in names if t in wanted]
    if st.what == "measurements":
        if isinstance(st.measurement, RegexLit):
            names = [t for t in names if re.search(st.measurement.pattern, t)]
        elif isinstance(st.measurement, Ident):
            names = [t for t in names if t == st.measurement.name]
        if st.condition is not None:
            names = [t for t in names if _any_row(t, st.condition, run_sql, tables[t])]
        rows = [[t] for t in names][st.offset:]
        rows = rows[:st.limit] if st.limit else rows
        return [Series("measurements", ["name"], rows)] if rows else []
    out = []
    for t in names:
        schema = _Schema([c for c, role, _t in tables[t] if role == "tag"],
                         {c: ty for c, role, ty in tables[t] if role == "field"})
        if st.what == "tag keys":
            rows = [[k] for k in sorted(schema.tags)]
            out.append(Series(t, ["tagKey"], rows))
        elif st.what == "field keys":
            rows = [[k, FIELD_TYPES.get(ty, ty)] for k, ty in sorted(schema.fields.items())]
            out.append(Series(t, ["fieldKey", "fieldType"], rows))
        else:  # tag values
            keys = _keys(st, schema.tags)
            rows = []
            tr = _Translator(schema, 0)
            where = f" AND ({tr.cond(st.condition)})" if st.condition is not None else ""
            for k in keys:
                got = _table_of(run_sql(f"SELECT DISTINCT {_q(k)} AS v FROM {_q(t)} WHERE {_q(k)} IS NOT NULL AND "
                                        f"{_q(k)} != ''{where}"))
                rows += [[k, v] for v in sorted(got.column("v").to_pylist())]
            out.append(Series(t, ["key", "value"], rows))
        if st.offset or st.limit:
            out[-1].values = out[-1].values[st.offset:]
            if st.limit:
                out[-1].values = out[-1].values[:st.limit]
    return [s for s in out if s.values]


def _keys(st: Show, tags: list) -> list:
    if st.key_op == "in":
        return [k for k in st.keys if k in tags]
    if st.key_op == "=":
        return [st.keys] if st.keys in tags else []
    if st.key_op == "!=":
        return [k for k in sorted(tags) if k != st.keys]
    rx = re.compile(st.keys.pattern)
    return [k for k in sorted(tags) if bool(rx.search(k)) == (st.key_op == "=~")]


def _any_row(table: str, cond, run_sql, columns: list) -> bool:
    schema = _Schema([c for c, role, _t in columns if role == "tag"], {c: t for c, role, t in columns if role == "field"})
    sql = f"SELECT 1 AS x FROM {_q(table)} WHERE {_Translator(schema, 0).cond(cond)} LIMIT 1"
    return _table_of(run_sql(sql)).num_rows > 0


def execute(text: str, database: str, run_sql, tables, databases, now_ns: int,
            params: dict | None = None) -> list[StatementResult]:
    """The results of the statements of `text`, each read whole (its `series` a list), as `stream`
    answers them; an error while a statement's series are read is that statement's `error`."""
    out = []
    for res in stream(text, database, run_sql, tables, databases, now_ns, params):
        try:
            res.series = list(res.series)
        except Exception as e:  # noqa: BLE001 - as `stream` takes a statement's errors, or raised
            res.series, res.shapes = [], None
            res.error = _statement_error(e)
        out.append(res)
    return out


def stream(text: str, database: str, run_sql, tables, databases, now_ns: int,
           params: dict | None = None) -> Iterator[StatementResult]:
    """The results of the statements of `text`, one by one, each statement run when the next
    result is asked for (the previous SELECT's series, read or not, are closed then; `close()`
    closes the last). InfluxQLSyntaxError at once when any statement does not parse (nothing runs).

    `run_sql(database, sql)` runs a query through the query path: a pa.Table, or a QueryResult
    (`schema`, `batches()` read once, `table`, `close()`); `tables(database) -> {table: [(column,
    role, type)]}`; `databases() -> [names]` (those the caller may list). A statement that fails
    before its first series is made has its `error` (InfluxQLError, or the query path's error:
    `str(e)`), the others still run; a SELECT's `series` then stream (the first made already), and
    an error while they are read raises from them. A database is needed for every statement but
    SHOW DATABASES (InfluxQLError). `params`: the values of `$name` placeholders (`parse`)."""
    statements = parse(text, params)
    return _Statements(statements, lambda i, st: _statement(i, st, database, run_sql, tables, databases, now_ns))


def _statement_error(e: Exception) -> str:
    """A statement's `error` of what failed while it ran; anything else is raised again."""
    if isinstance(e, (InfluxQLError, ServerError)):  # the query path's errors too: this statement's only
        return str(e)
    if isinstance(e, (TypeError, ArithmeticError)):  # a function of values it cannot take (a rate of strings)
        return f"cannot compute this statement over the values it reads: {e}"
    raise e


class _Streamed:
    """A SELECT's series read once: the first (made before the statement was answered), then the
    rest; `close()` stops its queries."""

    def __init__(self, first: Series, rest: Iterator[Series]):
        self._first, self._rest = first, rest

    def __iter__(self):
        return self

    def __next__(self) -> Series:
        if self._first is not None:
            s, self._first = self._first, None
            return s
        return next(self._rest)

    def close(self) -> None:
        self._first = None
        self._rest.close()


class _Statements:
    """The statements' results, one by one (`stream`): the series of the one answered last are
    closed when the next one is asked for, or by `close()`; a SELECT's series dropped unread close
    their queries as they are collected (their generators' `finally`)."""

    def __init__(self, statements: list, run_one):
        self._todo = iter(enumerate(statements))
        self._run_one = run_one
        self._series = None  # the generator of the SELECT answered last

    def __iter__(self):
        return self

    def __next__(self) -> StatementResult:
        self._close_series()
        i, st = next(self._todo)
        res, self._series = self._run_one(i, st)
        return res

    def _close_series(self) -> None:
        series, self._series = self._series, None
        if series is not None:
            series.close()

    def close(self) -> None:
        self._close_series()
        self._todo = iter(())


def _statement(i: int, st, database: str, run_sql, tables, databases, now_ns: int):
    """(the StatementResult of statement `i`, the generator of its series or None): a SELECT up to
    its first series; what fails until then is its `error`."""
    res = StatementResult(i, tz=st.tz if isinstance(st, Select) else None)
    series = None
    try:
        db = (st.on if isinstance(st, Show) and st.on else database)
        if not db and not (isinstance(st, Show) and st.what == "databases"):
            raise InfluxQLError("database name required")
        known = tables(db) if db and not (isinstance(st, Show) and st.what in ("databases",)) else {}

        def run(sql, _db=db):
            return run_sql(_db, sql)

        if isinstance(st, Select):
            shapes, series = _select(st, run, known, now_ns)
            first = next(series, None)
            res.series, res.shapes = ([] if first is None else _Streamed(first, series)), shapes
        else:
            res.series = _show(st, db, run, known, databases)
    except Exception as e:  # noqa: BLE001 - a statement's errors are its own; anything else raises
        if series is not None:
            series.close()
            series = None
        res.error = _statement_error(e)
    return res, series
