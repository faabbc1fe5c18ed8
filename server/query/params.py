"""Query parameters: the values of a parameterised query's placeholders, bound as Spark SQL literals.

Invariant: a bound value is only ever a literal. The query text is scanned as Spark's lexer reads
it (quoted strings with backslash escapes, back-quoted identifiers, `--` and nested `/* */`
comments are passed over), and each placeholder outside them, `?` (positional, in order) or
`$name` (named, as InfluxDB 3 writes them), is replaced by its value rendered as a Spark SQL
literal: NULL, TRUE/FALSE, a number, a quoted and escaped string, X'hex' bytes, DATE or TIMESTAMP
(UTC). Nothing of a value is read as SQL. A placeholder without a value, a value without a
placeholder, or a value of a type with no literal is InvalidArgument; the query is then not run.

Who calls it: the Flight SQL service (prepared statements' bound parameters, server/api/flight_sql.py)
on the gRPC handler threads (driver). Pure.
"""
from __future__ import annotations

import datetime
import decimal
import math
import re

from iox_spark.server.errors import InvalidArgument

__all__ = ["bind_parameters", "sql_literal", "placeholders", "named_values"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _scan(sql: str):
    """Yields (start, end, kind, name) of each placeholder of `sql` outside strings, quoted
    identifiers and comments: kind "?" (name "") or "$" (its name)."""
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in ("'", '"'):
            i += 1
            while i < n and sql[i] != ch:
                i += 2 if sql[i] == "\\" else 1
            i += 1
        elif ch == "`":
            i += 1
            while i < n:
                if sql[i] == "`":
                    if i + 1 < n and sql[i + 1] == "`":  # a doubled back quote inside the name
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if sql.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif sql.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif ch == "?":
            yield i, i + 1, "?", ""
            i += 1
        elif ch == "$" and (m := _NAME.match(sql, i + 1)) is not None:
            yield i, m.end(), "$", m.group(0)
            i = m.end()
        else:
            i += 1


def named_values(value) -> dict:
    """A request's `params` (a decoded JSON value, as InfluxDB 3 and 1.x send them) as {name: value};
    InvalidArgument unless it is an object whose values are strings, numbers, booleans or nulls."""
    if not isinstance(value, dict):
        raise InvalidArgument("params must be a JSON object {name: value} (the query names them $name)")
    if any(isinstance(v, (dict, list)) for v in value.values()):
        raise InvalidArgument("a parameter value must be a string, number, boolean or null")
    return value


def placeholders(sql: str) -> tuple[int, list[str]]:
    """(number of `?` placeholders, the `$name` names in order of first use) of `sql`."""
    positional, named = 0, []
    for _s, _e, kind, name in _scan(sql):
        if kind == "?":
            positional += 1
        elif name not in named:
            named.append(name)
    return positional, named


def sql_literal(value) -> str:
    """`value` as a Spark SQL literal; InvalidArgument for a type that has none here."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return _signed(str(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "CAST('NaN' AS DOUBLE)"
        if math.isinf(value):
            return f"CAST('{'-' if value < 0 else ''}Infinity' AS DOUBLE)"
        return _signed(repr(value) + "D")
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise InvalidArgument(f"the parameter value {value} is not a finite decimal")
        return _signed(format(value, "f") + "BD")
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "X'" + bytes(value).hex() + "'"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"  # the session's time zone is UTC
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    raise InvalidArgument(f"a parameter of type {type(value).__name__} cannot be bound (give a number, "
                          f"string, boolean, bytes, date, timestamp or null)")


def _signed(number: str) -> str:
    """A negative number in parentheses: after a minus (`x-?`) its sign would start a comment."""
    return f"({number})" if number.startswith("-") else number


def bind_parameters(sql: str, positional: list | None = None, named: dict | None = None) -> str:
    """`sql` with its placeholders replaced by the literals of `positional` (for `?`, in order) and
    `named` (for `$name`); see the module invariant. A query without placeholders and without
    values is returned as it is."""
    positional, named = list(positional or ()), dict(named or {})
    out, last, used_pos, used_names = [], 0, 0, set()
    for start, end, kind, name in _scan(sql):
        if kind == "?":
            if used_pos >= len(positional):
                raise InvalidArgument(f"the query has more ? placeholders than the {len(positional)} "
                                      f"parameter value(s) given")
            value = positional[used_pos]
            used_pos += 1
        else:
            if name not in named:
                raise InvalidArgument(f"no value is given for the parameter ${name}")
            value = named[name]
            used_names.add(name)
        out.append(sql[last:start])
        out.append(sql_literal(value))
        last = end
    if used_pos < len(positional):
        raise InvalidArgument(f"{len(positional)} positional parameter value(s) given for {used_pos} ? placeholder(s)")
    unused = sorted(set(named) - used_names)
    if unused:
        raise InvalidArgument(f"parameter(s) {', '.join('$' + u for u in unused)} given but not used in the query")
    out.append(sql[last:])
    return "".join(out)
