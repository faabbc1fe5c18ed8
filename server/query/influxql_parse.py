"""InfluxQL's syntax: statements parsed into a small tree (InfluxDB 1.x's grammar, the part this
server answers).

Invariant: a statement either parses whole into the tree below or raises InfluxQLSyntaxError
naming the position and what was expected; nothing is guessed. Keywords are case-insensitive;
identifiers are bare (`[A-Za-z_][A-Za-z0-9_]*`) or double-quoted (backslash escapes); strings are
single-quoted; regexes are `/.../` where a regex may stand (after `=~`/`!~`, in FROM, GROUP BY and
SHOW ... WITH); durations are integers with a unit (`ns u µ ms s m h d w`, also compound `1h30m`);
`$name` is a parameter, replaced by the literal of its value.

Served: SELECT (fields, `*`, calls, arithmetic, `::field`/`::tag` casts, AS) FROM (names, `db.rp.name`,
regexes) WHERE GROUP BY (time(interval[, offset]), tags, `*`, regexes) fill(...) ORDER BY time
LIMIT OFFSET SLIMIT SOFFSET tz(...); SHOW DATABASES, MEASUREMENTS, TAG KEYS, TAG VALUES, FIELD KEYS,
RETENTION POLICIES. Subqueries: FROM (SELECT ...).

Pure; who calls it: server/query/influxql.py on the handler threads (driver).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["InfluxQLSyntaxError", "parse", "Ident", "StringLit", "NumberLit", "DurationLit", "RegexLit",
           "BoolLit", "Now", "Wildcard", "Call", "Binary", "Field", "Source", "Select", "Show",
           "duration_ns", "TIME"]

TIME = "time"


class InfluxQLSyntaxError(ValueError):
    """A query that is not InfluxQL this server reads: `position` (0-based) and what went wrong."""

    def __init__(self, message: str, position: int):
        self.position = position
        super().__init__(f"error parsing query: {message} at position {position}")


@dataclass(frozen=True)
class Ident:
    name: str
    cast: str | None = None  # "field" | "tag" | a type name


@dataclass(frozen=True)
class StringLit:
    value: str


@dataclass(frozen=True)
class NumberLit:
    value: int | float


@dataclass(frozen=True)
class DurationLit:
    ns: int


@dataclass(frozen=True)
class RegexLit:
    pattern: str


@dataclass(frozen=True)
class BoolLit:
    value: bool


@dataclass(frozen=True)
class Now:
    pass


@dataclass(frozen=True)
class Wildcard:
    kind: str | None = None  # `*::field`, `*::tag`


@dataclass(frozen=True)
class Call:
    name: str  # lower case
    args: tuple


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / % = != <> < <= > >= =~ !~ AND OR
    left: object
    right: object


@dataclass(frozen=True)
class Field:
    expr: object
    alias: str | None = None


@dataclass(frozen=True)
class Source:
    name: str | None = None
    regex: str | None = None
    subquery: "Select | None" = None


@dataclass
class Select:
    fields: list
    sources: list
    condition: object = None
    dimensions: list = field(default_factory=list)
    fill: object = "null"  # "null" | "none" | "previous" | "linear" | a number
    order_desc: bool = False
    limit: int = 0
    offset: int = 0
    slimit: int = 0
    soffset: int = 0
    tz: str | None = None


@dataclass
class Show:
    what: str  # databases | measurements | tag keys | tag values | field keys | retention policies
    sources: list = field(default_factory=list)
    condition: object = None
    measurement: object = None  # WITH MEASUREMENT = name (Ident) / =~ regex (RegexLit)
    key_op: str = ""  # SHOW TAG VALUES: "=", "!=", "=~", "!~", "in"
    keys: object = None  # SHOW TAG VALUES: a key name, a RegexLit, or a tuple of names
    limit: int = 0
    offset: int = 0
    on: str | None = None


_UNITS = {"ns": 1, "u": 1_000, "µ": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
          "h": 3_600_000_000_000, "d": 86_400_000_000_000, "w": 604_800_000_000_000}
_DURATION = re.compile(r"(\d+)(ns|ms|u|µ|s|m|h|d|w)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"\d+(\.\d*)?([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?")
_OPS = ("=~", "!~", "!=", "<>", "<=", ">=", "::", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",", ";", ".")


def duration_ns(text: str) -> int:
    """Nanoseconds of a duration literal (`10s`, `1h30m`); ValueError when it is not one."""
    pos, total = 0, 0
    while pos < len(text):
        m = _DURATION.match(text, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r}")
        total += int(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not text:
        raise ValueError("empty duration")
    return total


@dataclass(frozen=True)
class _Tok:
    kind: str  # ident, qident, string, int, float, duration, op, eof
    value: object
    pos: int
    end: int


class _Scanner:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def _skip(self) -> None:
        t = self.text
        while self.pos < len(t):
            if t[self.pos].isspace():
                self.pos += 1
            elif t.startswith("--", self.pos):
                nl = t.find("\n", self.pos)
                self.pos = len(t) if nl < 0 else nl + 1
            elif t.startswith("/*", self.pos):
                end = t.find("*/", self.pos + 2)
                if end < 0:
                    raise InfluxQLSyntaxError("unterminated comment", self.pos)
                self.pos = end + 2
            else:
                break

    def _quoted(self, start: int, quote: str) -> tuple[str, int]:
        out, i, t = [], start + 1, self.text
        while i < len(t):
            ch = t[i]
            if ch == "\\" and i + 1 < len(t):
                nxt = t[i + 1]
                out.append({"n": "\n", "t": "\t"}.get(nxt, nxt))
                i += 2
                continue
            if ch == quote:
                return "".join(out), i + 1
            if ch == "\n" and quote == "'":
                break
            out.append(ch)
            i += 1
        raise InfluxQLSyntaxError(f"unterminated {'string' if quote == chr(39) else 'identifier'}", start)

    def peek(self) -> _Tok:
        self._skip()
        t, p = self.text, self.pos
        if p >= len(t):
            return _Tok("eof", None, p, p)
        ch = t[p]
        if ch == "'":
            value, end = self._quoted(p, "'")
            return _Tok("string", value, p, end)
        if ch == '"':
            value, end = self._quoted(p, '"')
            return _Tok("qident", value, p, end)
        if ch.isdigit() or (ch == "." and p + 1 < len(t) and t[p + 1].isdigit()):
            m = _NUMBER.match(t, p)
            end = m.end()
            if m.group(0).isdigit():
                d = re.compile(r"(\d+(ns|ms|u|µ|s|m|h|d|w))+(?![A-Za-z0-9_])").match(t, p)
                if d is not None:
                    return _Tok("duration", duration_ns(d.group(0)), p, d.end())
                return _Tok("int", int(m.group(0)), p, end)
            return _Tok("float", float(m.group(0)), p, end)
        m = _IDENT.match(t, p)
        if m is not None:
            return _Tok("ident", m.group(0), p, m.end())
        if ch == "$" and (m := _IDENT.match(t, p + 1)) is not None:
            return _Tok("param", m.group(0), p, m.end())
        for op in _OPS:
            if t.startswith(op, p):
                return _Tok("op", op, p, p + len(op))
        raise InfluxQLSyntaxError(f"unexpected {ch!r}", p)

    def next(self) -> _Tok:
        tok = self.peek()
        self.pos = tok.end
        return tok

    def regex(self) -> str | None:
        """A `/.../` regex at the position (None when there is none); `\\/` is a slash in it."""
        self._skip()
        t, p = self.text, self.pos
        if p >= len(t) or t[p] != "/":
            return None
        out, i = [], p + 1
        while i < len(t):
            if t[i] == "\\" and i + 1 < len(t) and t[i + 1] == "/":
                out.append("/")
                i += 2
                continue
            if t[i] == "/":
                self.pos = i + 1
                return "".join(out)
            out.append(t[i])
            i += 1
        raise InfluxQLSyntaxError("unterminated regex", p)


class _Parser:
    def __init__(self, text: str, params: dict | None = None):
        self.s = _Scanner(text)
        self.params = dict(params or {})
        self.used: set = set()

    # -- tokens -------------------------------------------------------------------------------
    def _kw(self, *words: str) -> bool:
        """Whether the next tokens are the keywords `words` (consumed when they are)."""
        save = self.s.pos
        for w in words:
            tok = self.s.peek()
            if tok.kind != "ident" or tok.value.lower() != w:
                self.s.pos = save
                return False
            self.s.next()
        return True

    def _expect_kw(self, *words: str) -> None:
        if not self._kw(*words):
            tok = self.s.peek()
            raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected {' '.join(words).upper()}", tok.pos)

    def _op(self, op: str) -> bool:
        tok = self.s.peek()
        if tok.kind == "op" and tok.value == op:
            self.s.next()
            return True
        return False

    def _expect_op(self, op: str) -> None:
        if not self._op(op):
            tok = self.s.peek()
            raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected {op}", tok.pos)

    @staticmethod
    def _show(tok: _Tok) -> str:
        return "EOF" if tok.kind == "eof" else str(tok.value)

    def _ident(self, what: str = "identifier") -> str:
        tok = self.s.next()
        if tok.kind in ("ident", "qident"):
            return tok.value
        raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected {what}", tok.pos)

    def _int(self, what: str) -> int:
        tok = self.s.next()
        if tok.kind != "int":
            raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected {what} (an integer)", tok.pos)
        return tok.value

    # -- statements ---------------------------------------------------------------------------
    def statements(self) -> list:
        out = []
        while True:
            while self._op(";"):
                pass
            if self.s.peek().kind == "eof":
                break
            out.append(self.statement())
            tok = self.s.peek()
            if tok.kind != "eof" and not (tok.kind == "op" and tok.value == ";"):
                raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected ; or EOF", tok.pos)
        if not out:
            raise InfluxQLSyntaxError("empty query", 0)
        return out

    def statement(self):
        if self._kw("select"):
            return self.select()
        if self._kw("show"):
            return self.show()
        tok = self.s.peek()
        raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected SELECT or SHOW (this server answers queries; "
                                  f"write with the write APIs)", tok.pos)

    def select(self) -> Select:
        fields = [self.field()]
        while self._op(","):
            fields.append(self.field())
        self._expect_kw("from")
        st = Select(fields=fields, sources=self.sources())
        if self._kw("where"):
            st.condition = self.expr()
        if self._kw("group", "by"):
            st.dimensions = [self.dimension()]
            while self._op(","):
                st.dimensions.append(self.dimension())
        if self._kw("fill"):
            self._expect_op("(")
            tok = self.s.next()
            if tok.kind == "ident" and tok.value.lower() in ("null", "none", "previous", "linear"):
                st.fill = tok.value.lower()
            elif tok.kind in ("int", "float"):
                st.fill = tok.value
            elif tok.kind == "op" and tok.value == "-" and self.s.peek().kind in ("int", "float"):
                st.fill = -self.s.next().value
            else:
                raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected null, none, previous, linear or a number",
                                          tok.pos)
            self._expect_op(")")
        if self._kw("order", "by"):
            name = self._ident("time")
            if name.lower() != TIME:
                raise InfluxQLSyntaxError("only ORDER BY time supported at this time", self.s.pos)
            if self._kw("desc"):
                st.order_desc = True
            else:
                self._kw("asc")
        for kw in ("limit", "offset", "slimit", "soffset"):
            if self._kw(kw):
                setattr(st, kw, self._int(kw.upper()))
        if self._kw("tz"):
            self._expect_op("(")
            tok = self.s.next()
            if tok.kind != "string":
                raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected a time zone string", tok.pos)
            st.tz = tok.value
            self._expect_op(")")
        return st

    def field(self) -> Field:
        expr = self.expr()
        alias = self._ident("alias") if self._kw("as") else None
        return Field(expr, alias)

    def sources(self) -> list:
        out = [self.source()]
        while self._op(","):
            out.append(self.source())
        return out

    def source(self) -> Source:
        rx = self.s.regex()
        if rx is not None:
            return Source(regex=rx)
        if self._op("("):
            if not self._kw("select"):
                tok = self.s.peek()
                raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected SELECT", tok.pos)
            sub = self.select()
            self._expect_op(")")
            return Source(subquery=sub)
        parts = [self._ident("measurement")]
        while self._op("."):
            if self.s.peek().kind == "op" and self.s.peek().value == ".":
                parts.append("")
                continue
            rx = self.s.regex()
            if rx is not None:
                return Source(regex=rx)
            parts.append(self._ident("measurement"))
        return Source(name=parts[-1])

    def dimension(self):
        rx = self.s.regex()
        if rx is not None:
            return RegexLit(rx)
        if self._op("*"):
            return Wildcard()
        return self.expr()

    # -- expressions (InfluxQL's precedence: OR < AND < comparisons < + - < * / %) ---------------
    def expr(self):
        left = self._and()
        while self._kw("or"):
            left = Binary("OR", left, self._and())
        return left

    def _and(self):
        left = self._cmp()
        while self._kw("and"):
            left = Binary("AND", left, self._cmp())
        return left

    def _cmp(self):
        left = self._add()
        tok = self.s.peek()
        if tok.kind == "op" and tok.value in ("=", "!=", "<>", "<", "<=", ">", ">=", "=~", "!~"):
            self.s.next()
            op = "!=" if tok.value == "<>" else tok.value
            if op in ("=~", "!~"):
                rx = self.s.regex()
                if rx is None:
                    at = self.s.peek()
                    raise InfluxQLSyntaxError(f"found {self._show(at)}, expected regex", at.pos)
                return Binary(op, left, RegexLit(rx))
            return Binary(op, left, self._add())
        return left

    def _add(self):
        left = self._mul()
        while True:
            tok = self.s.peek()
            if tok.kind == "op" and tok.value in ("+", "-"):
                self.s.next()
                left = Binary(tok.value, left, self._mul())
            else:
                return left

    def _mul(self):
        left = self._unary()
        while True:
            tok = self.s.peek()
            if tok.kind == "op" and tok.value in ("*", "/", "%"):
                self.s.next()
                left = Binary(tok.value, left, self._unary())
            else:
                return left

    def _unary(self):
        tok = self.s.peek()
        if tok.kind == "op" and tok.value == "-":
            self.s.next()
            inner = self._unary()
            if isinstance(inner, NumberLit):
                return NumberLit(-inner.value)
            if isinstance(inner, DurationLit):
                return DurationLit(-inner.ns)
            return Binary("*", NumberLit(-1), inner)
        return self._primary()

    def _primary(self):
        tok = self.s.next()
        if tok.kind == "op" and tok.value == "(":
            inner = self.expr()
            self._expect_op(")")
            return inner
        if tok.kind == "op" and tok.value == "*":
            kind = None
            if self._op("::"):
                kind = self._ident("field or tag").lower()
            return Wildcard(kind)
        if tok.kind == "string":
            return StringLit(tok.value)
        if tok.kind in ("int", "float"):
            return NumberLit(tok.value)
        if tok.kind == "param":
            return self._param(tok)
        if tok.kind == "duration":
            return DurationLit(tok.value)
        if tok.kind == "ident" and tok.value.lower() in ("true", "false"):
            return BoolLit(tok.value.lower() == "true")
        if tok.kind in ("ident", "qident"):
            if tok.kind == "ident" and self._op("("):
                name = tok.value.lower()
                if name == "now":
                    self._expect_op(")")
                    return Now()
                args = []
                if not self._op(")"):
                    args.append(self.expr() if not self._peek_regex() else RegexLit(self.s.regex()))
                    while self._op(","):
                        args.append(self.expr())
                    self._expect_op(")")
                return Call(name, tuple(args))
            cast = self._ident("type").lower() if self._op("::") else None
            return Ident(tok.value, cast)
        raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected identifier, string, number, bool", tok.pos)

    def _param(self, tok: _Tok):
        """The literal a `$name` placeholder stands for (its value in `params`)."""
        if tok.value not in self.params:
            raise InfluxQLSyntaxError(f"no value is given for the parameter ${tok.value}", tok.pos)
        self.used.add(tok.value)
        v = self.params[tok.value]
        if isinstance(v, bool):
            return BoolLit(v)
        if isinstance(v, (int, float)):
            return NumberLit(v)
        if isinstance(v, str):
            return StringLit(v)
        raise InfluxQLSyntaxError(f"the parameter ${tok.value} must be a string, number or boolean", tok.pos)

    def _peek_regex(self) -> bool:
        self.s._skip()
        return self.s.pos < len(self.s.text) and self.s.text[self.s.pos] == "/"

    def show(self) -> Show:
        if self._kw("databases"):
            return Show("databases")
        if self._kw("retention", "policies"):
            st = Show("retention policies")
            if self._kw("on"):
                st.on = self._ident("database")
            return st
        if self._kw("measurements"):
            st = Show("measurements")
            if self._kw("on"):
                st.on = self._ident("database")
            if self._kw("with", "measurement"):
                if self._op("="):
                    rx = self.s.regex()
                    st.measurement = RegexLit(rx) if rx is not None else Ident(self._ident("measurement"))
                else:
                    self._expect_op("=~")
                    rx = self.s.regex()
                    if rx is None:
                        raise InfluxQLSyntaxError("expected regex", self.s.pos)
                    st.measurement = RegexLit(rx)
            self._show_tail(st)
            return st
        for words, what in ((("tag", "keys"), "tag keys"), (("field", "keys"), "field keys"),
                            (("tag", "values"), "tag values")):
            if self._kw(*words):
                st = Show(what)
                if self._kw("on"):
                    st.on = self._ident("database")
                if self._kw("from"):
                    st.sources = self.sources()
                if what == "tag values":
                    self._expect_kw("with", "key")
                    if self._kw("in"):
                        self._expect_op("(")
                        keys = [self._ident("tag key")]
                        while self._op(","):
                            keys.append(self._ident("tag key"))
                        self._expect_op(")")
                        st.key_op, st.keys = "in", tuple(keys)
                    else:
                        tok = self.s.next()
                        if tok.kind != "op" or tok.value not in ("=", "!=", "<>", "=~", "!~"):
                            raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected =, !=, =~, !~ or IN",
                                                      tok.pos)
                        st.key_op = "!=" if tok.value == "<>" else tok.value
                        if st.key_op in ("=~", "!~"):
                            rx = self.s.regex()
                            if rx is None:
                                raise InfluxQLSyntaxError("expected regex", self.s.pos)
                            st.keys = RegexLit(rx)
                        else:
                            st.keys = self._ident("tag key")
                self._show_tail(st)
                return st
        tok = self.s.peek()
        raise InfluxQLSyntaxError(f"found {self._show(tok)}, expected DATABASES, MEASUREMENTS, TAG KEYS, "
                                  f"TAG VALUES, FIELD KEYS or RETENTION POLICIES", tok.pos)

    def _show_tail(self, st: Show) -> None:
        if self._kw("where"):
            st.condition = self.expr()
        for kw in ("limit", "offset"):
            if self._kw(kw):
                setattr(st, kw, self._int(kw.upper()))


def parse(text: str, params: dict | None = None) -> list:
    """The statements of `text` (`;`-separated): Select and Show trees; InfluxQLSyntaxError when
    any does not parse. `params`: the values of its `$name` placeholders (each read as the literal
    of its value, never as InfluxQL); a placeholder without a value, or a value without a
    placeholder, is an InfluxQLSyntaxError."""
    parser = _Parser(text, params)
    out = parser.statements()
    unused = sorted(set(parser.params) - parser.used)
    if unused:
        raise InfluxQLSyntaxError(f"parameter(s) {', '.join('$' + u for u in unused)} given but not used in the "
                                  f"query", len(text))
    return out
