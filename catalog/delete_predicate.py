"""The delete predicate language (IOx style): parsing, schema checks, Spark SQL.

A delete names a database, a table (empty = every table), a time range
``[start, stop)`` and a predicate. This module is pure logic: no Spark, no I/O.

Invariant: a predicate is either parsed *completely* into a conjunction of
simple comparisons (``column = literal`` / ``column != literal`` joined by
``AND``) or rejected with an :class:`InvalidDelete` whose reason says what is
wrong and where (0-based character position) -- never partially: nothing
is ignored, guessed or silently dropped, and every accepted literal
keeps its exact value (integers as Python ints, floats as the nearest double,
strings after unescaping; times keep all 9 fractional digits).

Grammar::

    predicate := ε | term (AND term)*            -- AND is case-insensitive
    term      := column ("=" | "!=") literal
    column    := [A-Za-z_][A-Za-z0-9_.-]*        -- not a keyword (and/or/not/true/false/null)
               | `any name`                      -- `` inside escapes a backtick
    literal   := 'string' | "string"             -- escapes: \\' \\" \\\\
               | -?digits                        -- integer, range [-2^63, 2^64-1]
               | -?(digits.digits? | .digits)(e[+-]?digits)? | -?digits e[+-]?digits   -- float
               | true | false                    -- case-insensitive

The rendered Spark SQL is NULL-safe: a row whose column is NULL never matches
(``coalesce(<cmp>, false)``), for ``=`` and ``!=`` alike.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Union
from iox_spark.catalog.errors import CatalogError

__all__ = [
    "InvalidDelete",
    "Term",
    "KINDS",
    "OPS",
    "parse_time",
    "parse_time_range",
    "parse_predicate",
    "validate_against_schema",
    "term_to_sql",
    "predicate_sql",
    "render_predicate",
    "to_json",
    "from_json",
    "literal_kind",
]

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1

OPS = ("=", "!=")
KINDS = ("string", "integer", "float", "boolean")
_KEYWORDS = frozenset({"and", "or", "not", "true", "false", "null"})
_UNSUPPORTED_WORD_OPS = frozenset({"like", "in", "is", "between", "ilike", "rlike", "regexp"})

Value = Union[str, int, float, bool]


class InvalidDelete(CatalogError, ValueError):
    """A delete request that is rejected; ``field`` names the offending part."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        super().__init__(f"invalid delete {field}: {reason}")

    def __str__(self) -> str:
        return f"invalid delete {self.field}: {self.reason}"


@dataclass(frozen=True)
class Term:
    """One comparison ``column op value``; ``kind`` is the literal's kind."""

    column: str
    op: str
    value: Value
    kind: str

    def __post_init__(self) -> None:
        problem = _term_problem(self.column, self.op, self.value, self.kind)
        if problem:
            raise ValueError(problem)


def _term_problem(column, op, value, kind) -> Optional[str]:
    if not isinstance(column, str) or column == "":
        return f"column must be a non-empty string, got {column!r}"
    if op not in OPS:
        return f"op must be one of {OPS}, got {op!r}"
    if kind not in KINDS:
        return f"kind must be one of {KINDS}, got {kind!r}"
    if kind == "string" and not isinstance(value, str):
        return f"a string term needs a str value, got {value!r}"
    if kind == "boolean" and not isinstance(value, bool):
        return f"a boolean term needs a bool value, got {value!r}"
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"an integer term needs an int value, got {value!r}"
        if not I64_MIN <= value <= U64_MAX:
            return f"integer {value} is out of range [-2^63, 2^64-1]"
    if kind == "float":
        if not isinstance(value, float):
            return f"a float term needs a float value, got {value!r}"
        if not math.isfinite(value):
            return f"a float term needs a finite value, got {value!r}"
    return None


# --------------------------------------------------------------------------- time

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)
_INT_NS = re.compile(r"-?\d+", re.ASCII)
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


def parse_time(text: str, field: str = "time") -> int:
    """An RFC3339 timestamp or a plain integer of nanoseconds -> int64 ns since the epoch.

    The fraction (1..9 digits) is kept exactly (integer arithmetic, no float or
    datetime microseconds). Surrounding whitespace is ignored. Errors raise
    ``InvalidDelete(field, reason)``.
    """
    if not isinstance(text, str):
        raise InvalidDelete(field, f"expected a string timestamp, got {type(text).__name__}")
    s = text.strip()
    if s == "":
        raise InvalidDelete(field, "empty timestamp; expected RFC3339 (e.g. 2024-01-01T00:00:00Z) "
                                   "or integer nanoseconds")
    if _INT_NS.fullmatch(s):
        ns = int(s)
    else:
        m = _RFC3339.fullmatch(s)
        if m is None:
            raise InvalidDelete(field, f"{text!r} is neither an RFC3339 timestamp "
                                       "(e.g. 2024-01-01T00:00:00Z) nor integer nanoseconds")
        year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
        frac = m.group(7) or ""
        if len(frac) > 9:
            raise InvalidDelete(field, f"{text!r} has {len(frac)} fractional digits; at most 9 "
                                       "(nanoseconds) are supported")
        try:
            ordinal = _dt.date(year, month, day).toordinal()
        except ValueError as e:
            raise InvalidDelete(field, f"{text!r} has an invalid date: {e}") from None
        if hour > 23 or minute > 59 or second > 59:
            raise InvalidDelete(field, f"{text!r} has an invalid time of day "
                                       f"{hour:02d}:{minute:02d}:{second:02d}")
        offset_s = 0
        if m.group(9):
            oh, om = int(m.group(10)), int(m.group(11))
            if oh > 23 or om > 59:
                raise InvalidDelete(field, f"{text!r} has an invalid UTC offset")
            offset_s = (oh * 3600 + om * 60) * (1 if m.group(9) == "+" else -1)
        secs = (ordinal - _EPOCH_ORDINAL) * 86400 + hour * 3600 + minute * 60 + second - offset_s
        ns = secs * 1_000_000_000 + int(frac.ljust(9, "0") or "0")
    if not I64_MIN <= ns <= I64_MAX:
        raise InvalidDelete(field, f"{text!r} is outside the int64 nanosecond range")
    return ns


def parse_time_range(start: str, stop: str) -> tuple[int, int]:
    """Parse ``[start, stop)``; the range must not be empty (start < stop)."""
    lo = parse_time(start, "start")
    hi = parse_time(stop, "stop")
    if lo >= hi:
        raise InvalidDelete("stop", f"stop ({hi}) must be after start ({lo}); the range "
                                    "[start, stop) is empty")
    return lo, hi


# --------------------------------------------------------------------------- lexer

_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_IDENT_CHARS = _IDENT_START | frozenset("0123456789.-")
_BARE_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_NUMBER = re.compile(r"-?(?:\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_DIGITS = frozenset("0123456789")
_OP_CHARS = frozenset("=!<>~")
_ESCAPES = {"'": "'", '"': '"', "\\": "\\"}


@dataclass(frozen=True)
class _Tok:
    kind: str  # ident | qident | string | integer | float | op | lparen | rparen | comma | eof
    value: object
    pos: int
    text: str

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        if self.kind == "string":
            return f"string literal {self.text}"
        if self.kind in ("integer", "float"):
            return f"number {self.text}"
        if self.kind == "qident":
            return f"column {self.text}"
        if self.kind == "ident":
            return f"'{self.text}'"
        return f"'{self.text}'"


def _err(reason: str) -> InvalidDelete:
    return InvalidDelete("predicate", reason)


class _Lexer:
    """Produces tokens on demand, so the first error in reading order is reported."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self._peeked: Optional[_Tok] = None

    def peek(self) -> _Tok:
        if self._peeked is None:
            self._peeked = self._read()
        return self._peeked

    def next(self) -> _Tok:
        tok = self.peek()
        self._peeked = None
        return tok

    def _read(self) -> _Tok:
        s, n = self.s, len(self.s)
        i = self.i
        while i < n and s[i].isspace():
            i += 1
        if i >= n:
            self.i = i
            return _Tok("eof", None, i, "")
        c = s[i]
        if c in _IDENT_START:
            m = _BARE_IDENT.match(s, i)
            self.i = m.end()
            return _Tok("ident", m.group(), i, m.group())
        if c == "`":
            return self._read_backtick(i)
        if c in ("'", '"'):
            return self._read_string(i)
        if c in _DIGITS or c == "." or (c == "-" and i + 1 < n and (s[i + 1] in _DIGITS or s[i + 1] == ".")):
            return self._read_number(i)
        if c in _OP_CHARS:
            j = i
            while j < n and s[j] in _OP_CHARS:
                j += 1
            self.i = j
            return _Tok("op", s[i:j], i, s[i:j])
        simple = {"(": "lparen", ")": "rparen", ",": "comma"}
        if c in simple:
            self.i = i + 1
            return _Tok(simple[c], c, i, c)
        raise _err(f"unexpected character {c!r} at position {i}")

    def _read_backtick(self, start: int) -> _Tok:
        s, n = self.s, len(self.s)
        i = start + 1
        out = []
        while True:
            if i >= n:
                raise _err(f"unterminated backtick-quoted column name starting at position {start}")
            if s[i] == "`":
                if i + 1 < n and s[i + 1] == "`":
                    out.append("`")
                    i += 2
                    continue
                break
            out.append(s[i])
            i += 1
        self.i = i + 1
        name = "".join(out)
        if name == "":
            raise _err(f"empty column name `` at position {start}")
        return _Tok("qident", name, start, s[start:i + 1])

    def _read_string(self, start: int) -> _Tok:
        s, n = self.s, len(self.s)
        q = s[start]
        i = start + 1
        out = []
        while True:
            if i >= n:
                raise _err(f"unterminated string literal starting at position {start} "
                           f"(missing closing {q})")
            c = s[i]
            if c == q:
                break
            if c == "\\":
                if i + 1 >= n:
                    raise _err(f"unterminated string literal starting at position {start} "
                               f"(input ends after a backslash at position {i})")
                e = s[i + 1]
                if e not in _ESCAPES:
                    raise _err(f"unsupported escape sequence '\\{e}' at position {i} in string "
                               f"literal starting at position {start}; only \\' \\\" and \\\\ are allowed")
                out.append(_ESCAPES[e])
                i += 2
                continue
            out.append(c)
            i += 1
        self.i = i + 1
        return _Tok("string", "".join(out), start, s[start:i + 1])

    def _read_number(self, start: int) -> _Tok:
        s, n = self.s, len(self.s)
        m = _NUMBER.match(s, start)
        if m is None:
            raise _err(f"malformed number at position {start}")
        end = m.end()
        if end < n and (s[end] in _IDENT_CHARS or s[end] in "+"):
            j = end
            while j < n and (s[j] in _IDENT_CHARS or s[j] in "+"):
                j += 1
            raise _err(f"malformed number {s[start:j]!r} at position {start}")
        text = m.group()
        self.i = end
        if m.group(1) is None and m.group(2) is None and "." not in text:
            v = int(text)
            if not I64_MIN <= v <= U64_MAX:
                raise _err(f"integer literal {text} at position {start} is out of range "
                           "[-2^63, 2^64-1]")
            return _Tok("integer", v, start, text)
        f = float(text)
        if not math.isfinite(f):
            raise _err(f"float literal {text} at position {start} is out of range")
        return _Tok("float", f, start, text)


# --------------------------------------------------------------------------- parser

def parse_predicate(text: str) -> list[Term]:
    """Parse a delete predicate; empty/whitespace-only text means "no condition" ([])."""
    if not isinstance(text, str):
        raise _err(f"expected a string predicate, got {type(text).__name__}")
    if text.strip() == "":
        return []
    lx = _Lexer(text)
    terms = [_parse_term(lx, None)]
    while True:
        tok = lx.next()
        if tok.kind == "eof":
            return terms
        if tok.kind == "ident" and tok.value.lower() == "and":
            terms.append(_parse_term(lx, tok))
            continue
        if tok.kind == "ident" and tok.value.lower() == "or":
            raise _err(f"OR at position {tok.pos} is not supported; a delete predicate is a "
                       "conjunction (AND) of comparisons")
        if tok.kind in ("lparen", "rparen"):
            raise _err(f"parentheses are not supported (found {tok.text!r} at position {tok.pos})")
        if tok.kind == "op":
            raise _err(f"unexpected operator {tok.text!r} at position {tok.pos}; each comparison "
                       "is column = literal or column != literal, joined by AND")
        raise _err(f"unexpected {tok.describe()} at position {tok.pos}; expected AND or the "
                   "end of the predicate")


def _parse_term(lx: _Lexer, after_and: Optional[_Tok]) -> Term:
    col = lx.next()
    where = "" if after_and is None else f" (after AND at position {after_and.pos})"
    if col.kind == "ident":
        low = col.value.lower()
        if low == "or":
            raise _err(f"OR at position {col.pos} is not supported; a delete predicate is a "
                       "conjunction (AND) of comparisons")
        if low == "not":
            raise _err(f"NOT at position {col.pos} is not supported; use != instead")
        if low in _KEYWORDS:
            raise _err(f"expected a column name at position {col.pos}{where}, found keyword "
                       f"{col.text!r} (quote a column with this name with backticks)")
        column = col.value
    elif col.kind == "qident":
        column = col.value
    elif col.kind == "eof":
        raise _err(f"expected a column name at position {col.pos}{where}, found end of input")
    elif col.kind in ("lparen", "rparen"):
        raise _err(f"parentheses are not supported (found {col.text!r} at position {col.pos})")
    elif col.kind == "string" and col.text.startswith('"'):
        raise _err(f"expected a column name at position {col.pos}{where}, found string literal "
                   f"{col.text} (double quotes delimit string literals; quote column names "
                   "with backticks)")
    else:
        raise _err(f"expected a column name at position {col.pos}{where}, found {col.describe()}")

    op = lx.next()
    if op.kind == "op":
        if op.text not in OPS:
            raise _err(f"unsupported operator {op.text!r} at position {op.pos}; only = and != "
                       "are supported")
    elif op.kind == "ident" and op.value.lower() in _UNSUPPORTED_WORD_OPS | {"not"}:
        raise _err(f"unsupported operator {op.text.upper()} at position {op.pos}; only = and != "
                   "are supported")
    elif op.kind == "eof":
        raise _err(f"expected = or != after column {column!r} at position {op.pos}, found end "
                   "of input")
    else:
        raise _err(f"expected = or != after column {column!r} at position {op.pos}, found "
                   f"{op.describe()}")

    lit = lx.next()
    if lit.kind == "string":
        return Term(column, op.text, lit.value, "string")
    if lit.kind == "integer":
        return Term(column, op.text, lit.value, "integer")
    if lit.kind == "float":
        return Term(column, op.text, lit.value, "float")
    if lit.kind == "ident":
        low = lit.value.lower()
        if low in ("true", "false"):
            return Term(column, op.text, low == "true", "boolean")
        if low == "null":
            raise _err(f"NULL at position {lit.pos} is not supported as a literal (a NULL "
                       "column never matches a delete predicate)")
    if lit.kind in ("ident", "qident"):
        raise _err(f"expected a literal after {op.text!r} at position {lit.pos}, found column "
                   f"{lit.text}; comparing a column to a column is not supported "
                   "(quote strings with ' or \")")
    if lit.kind == "eof":
        raise _err(f"expected a literal after {op.text!r} at position {lit.pos}, found end "
                   "of input")
    if lit.kind in ("lparen", "rparen"):
        raise _err(f"parentheses are not supported (found {lit.text!r} at position {lit.pos})")
    raise _err(f"expected a literal after {op.text!r} at position {lit.pos}, found "
               f"{lit.describe()}")


# --------------------------------------------------------------------------- rendering back to text

def _render_column(name: str) -> str:
    if _BARE_IDENT.fullmatch(name) and name.lower() not in _KEYWORDS:
        return name
    return "`" + name.replace("`", "``") + "`"


def _render_literal(term: Term) -> str:
    if term.kind == "string":
        return "'" + term.value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if term.kind == "boolean":
        return "true" if term.value else "false"
    if term.kind == "float":
        return repr(term.value)
    return str(term.value)


def render_predicate(terms: Iterable[Term]) -> str:
    """Predicate text that :func:`parse_predicate` parses back to ``terms`` ('' for none)."""
    return " AND ".join(f"{_render_column(t.column)} {t.op} {_render_literal(t)}" for t in terms)


# --------------------------------------------------------------------------- schema

def validate_against_schema(terms: Iterable[Term], columns: dict, table: Optional[str]) -> None:
    """Check every term against a table schema ``{name: (role, type)}``.

    role: tag | field | time; type: string | float | integer | uinteger | boolean | time.
    """
    where = f" in table {table!r}" if table else ""
    for t in terms:
        spec = columns.get(t.column)
        if t.column == "time" or (spec is not None and (spec[0] == "time" or spec[1] == "time")):
            raise InvalidDelete("predicate", f"column {t.column!r} is the time column; restrict "
                                             "time with the delete's time range [start, stop), "
                                             "not the predicate")
        if spec is None:
            raise InvalidDelete("predicate", f"unknown column {t.column!r}{where}")
        role, typ = spec
        if role == "tag" or typ == "string":
            ok = t.kind == "string"
            typ_name = "tag (string)" if role == "tag" else "string"
        elif typ == "float":
            ok = t.kind in ("float", "integer")
            typ_name = typ
        elif typ == "integer":
            ok = t.kind == "integer"
            typ_name = typ
            if ok and not I64_MIN <= t.value <= I64_MAX:
                raise InvalidDelete("predicate", f"integer literal {t.value} is out of range for "
                                                 f"integer column {t.column!r}{where}")
        elif typ == "uinteger":
            ok = t.kind == "integer"
            typ_name = typ
            if ok and not 0 <= t.value <= U64_MAX:
                raise InvalidDelete("predicate", f"integer literal {t.value} is out of range for "
                                                 f"uinteger column {t.column!r}{where} "
                                                 "(must be in [0, 2^64-1])")
        elif typ == "boolean":
            ok = t.kind == "boolean"
            typ_name = typ
        else:
            raise InvalidDelete("predicate", f"column {t.column!r}{where} has unsupported type "
                                             f"{typ!r}")
        if not ok:
            raise InvalidDelete("predicate", f"column {t.column!r}{where} has type {typ_name} "
                                             f"but is compared to a {t.kind} literal "
                                             f"({_render_literal(t)})")


# --------------------------------------------------------------------------- Spark SQL

def _sql_string(s: str) -> str:
    # Spark SQL string literals unescape backslashes by default: escape \ and ' with \.
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_literal(term: Term, col_type: Optional[str]) -> str:
    if term.kind == "string":
        return _sql_string(term.value)
    if term.kind == "boolean":
        return "true" if term.value else "false"
    if term.kind == "float":
        # repr is the shortest exact round-trip text; the D suffix makes it a DOUBLE literal.
        return repr(term.value) + "D"
    if col_type == "uinteger":
        return f"CAST({term.value} AS DECIMAL(20,0))"
    return str(term.value)


def term_to_sql(term: Term, quote_ident: Callable[[str], str], col_type: Optional[str] = None) -> str:
    """A NULL-safe Spark SQL boolean expression for one term (NULL never matches)."""
    sql_op = "=" if term.op == "=" else "<>"
    return f"coalesce({quote_ident(term.column)} {sql_op} {_sql_literal(term, col_type)}, false)"


def predicate_sql(terms: Iterable[Term], quote_ident: Callable[[str], str],
                  col_types: Optional[dict] = None) -> str:
    """AND of :func:`term_to_sql` over ``terms``; ``"true"`` when there are none."""
    col_types = col_types or {}
    parts = [term_to_sql(t, quote_ident, col_types.get(t.column)) for t in terms]
    if not parts:
        return "true"
    return " AND ".join(parts)


# --------------------------------------------------------------------------- JSON

def to_json(terms: Iterable[Term]) -> list:
    """``[[column, op, value, kind], ...]`` (JSON-serialisable)."""
    return [[t.column, t.op, t.value, t.kind] for t in terms]


def from_json(data) -> list[Term]:
    """Inverse of :func:`to_json`; malformed input raises ``InvalidDelete('predicate', ...)``."""
    if not isinstance(data, (list, tuple)):
        raise _err(f"stored predicate must be a list, got {type(data).__name__}")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, (list, tuple)) or len(item) != 4:
            raise _err(f"stored term #{i} must be [column, op, value, kind], got {item!r}")
        column, op, value, kind = item
        if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # JSON writers may drop the ".0"
        problem = _term_problem(column, op, value, kind)
        if problem:
            raise _err(f"stored term #{i} is invalid: {problem}")
        out.append(Term(column, op, value, kind))
    return out


def literal_kind(value) -> str:
    """The literal kind (one of KINDS) of a recorded predicate value: the preserved catalog keeps
    (column, op, value), and a JSON value's type tells its kind."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    return "string"
