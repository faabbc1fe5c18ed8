"""InfluxDB line protocol -> per-table Arrow batches.

Grammar and semantics follow IOx (the Rust crates ``influxdb_line_protocol``
and ``mutable_batch_lp``) wherever InfluxDB 2.x (Go) differs:

* Lines are split like IOx ``split_lines`` (a port of Go ``scanLine``): a
  newline inside a quoted string field value, or right after a backslash, does
  not end the line.  Leading spaces, tabs and newlines are skipped; a line whose
  first non-whitespace character is ``#`` is a comment.  Blank and comment
  lines are not counted: ``LineError.line_number`` is the 1-based index among
  the remaining lines (that is what IOx reports).  A trailing ``\\r`` (CRLF
  line ending) is removed before parsing (an addition: IOx rejects it).
* Measurement: characters other than space, tab, newline, NUL, ``,`` and ``\\``;
  ``\\,`` ``\\ `` and ``\\\\`` are escapes.  Tag keys, tag values and field keys:
  characters other than space, tab, newline, ``\\`` and the delimiter (``=``
  for keys, ``,`` for tag values); ``\\,`` ``\\=`` ``\\ `` ``\\\\`` are escapes.
  A backslash before any other character is kept literally, and a name whose
  unescaped form ends with a backslash is rejected.  Tag values must not be
  empty.  Each name/value is at most 64 KiB (UTF-8 bytes).
* Field values: ``-?\\d+i`` (int64), ``\\d+u`` (uint64), float
  ``-?\\d+(\\.\\d+)?([eE][+-]?\\d+)?`` (so ``1.``, ``.5``, ``+1``, ``inf`` and
  ``NaN`` are rejected; huge exponents give +/-inf like IOx), strings in double
  quotes (only ``\\"`` and ``\\\\`` are escapes, at most 64 KiB) and booleans
  ``t T true True TRUE f F false False FALSE``.
* The timestamp is an optional signed integer after one or more spaces
  (trailing spaces are allowed only after a timestamp, like IOx); it is scaled
  by the precision (ns, us, ms, s; m and h for InfluxDB 1.x's /write) and must
  fit int64 nanoseconds.  A missing timestamp takes
  ``default_time_ns``.
* Write-step checks (``mutable_batch_lp``): a tag key repeated in a line, a
  name used as both tag and field in a line, a tag or field named ``time``, and
  a field repeated with different types are errors; a field repeated with the
  same type keeps the last value.  Within one request a table's columns keep
  the (role, type) of the first good line that wrote them; later lines that
  disagree are bad lines.

Speed: ``parse_lines`` first tries the C extension ``server.write._lpfast`` (see
``_parse_c``): one pass over the UTF-8 bytes, without the GIL, that implements
this grammar and the write-step checks for a request whose lines are ALL good.
It returns plain buffers (values, validity bitmaps, string offsets) that become
Arrow arrays without a copy.  On any bad line, column type conflict or invalid
UTF-8 (anywhere, a comment too), or anything it leaves to Python (a string
column over 2 GiB), it returns "fall back" and the Python path below runs
unchanged, so errors and their line numbers are always the Python path's.  Only
the C path knows ``unique_keys``.  If the extension is missing (not built), the
Python path does everything.

The Python path: the first line of each "shape" (measurement, tag keys and
field keys as written, field types) goes through the full parser, which then
compiles one regular expression for the shape; later lines of that shape are
matched by it alone and their captured strings are unescaped, checked (64 KiB,
integer and timestamp ranges) and converted per column with pyarrow at the end.
A row that fails those checks is parsed again by the full parser for its error.
Lines that match no shape take the full parser.  All paths give the same result
(tested: tests/unit/server/write/test_line_protocol*.py).
"""
from __future__ import annotations

import re
import time as _time
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

try:
    from iox_spark.server.write import _lpfast
except ImportError:  # not built: the Python path does everything
    _lpfast = None

__all__ = [
    "PRECISIONS",
    "ALL_PRECISIONS",
    "numbered_lines",
    "MAX_NAME_BYTES",
    "line_protocol_pieces",
    "ColumnRole",
    "ColumnType",
    "ColumnSpec",
    "LineError",
    "TableBatch",
    "ParseResult",
    "parse_lines",
]

ColumnRole = Literal["tag", "field", "time"]
ColumnType = Literal["string", "float", "integer", "uinteger", "boolean", "time"]

#: Timestamp precisions of the gRPC Write and the InfluxDB v2 HTTP API.
PRECISIONS = ("ns", "us", "ms", "s")
#: Every precision the parser takes: also minutes and hours (InfluxDB 1.x's /write only).
ALL_PRECISIONS = PRECISIONS + ("m", "h")
#: Longest measurement, tag key, tag value, field key or string value, in UTF-8 bytes.
MAX_NAME_BYTES = 65536

_MULTIPLIER = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
               "h": 3_600_000_000_000}
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_U64_MAX = (1 << 64) - 1

_ARROW_TYPE = {
    "string": pa.string(),
    "float": pa.float64(),
    "integer": pa.int64(),
    "uinteger": pa.uint64(),
    "boolean": pa.bool_(),
    "time": pa.int64(),
}


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    role: str  # "tag" | "field" | "time"
    type: str  # "string" | "float" | "integer" | "uinteger" | "boolean" | "time"


@dataclass(frozen=True)
class LineError:
    line_number: int  # 1-based, blank and comment lines not counted
    reason: str


@dataclass
class TableBatch:
    name: str
    columns: list[ColumnSpec]
    data: pa.Table
    #: True iff no two rows share (tag set, timestamp), False if some do, None if unknown (the
    #: Python path does not compute it). Not part of equality: it describes the data.
    unique_keys: bool | None = field(default=None, compare=False)


@dataclass
class ParseResult:
    tables: dict[str, TableBatch]
    errors: list[LineError]
    lines: int


class _Bad(Exception):
    """A line is invalid; args[0] is the reason."""


# --------------------------------------------------------------------------
# The full parser (one logical line, leading whitespace/comments removed)
# --------------------------------------------------------------------------

_MEAS_RUN = re.compile(r"[^ \t\n\x00,\\]+")
_KEY_RUN = re.compile(r"[^ \t\n=\\]+")  # tag keys and field keys
_TAGVAL_RUN = re.compile(r"[^ \t\n,\\]+")
_MEAS_ESCAPES = frozenset(", \\")
_KEY_ESCAPES = frozenset("\\,= ")
_SPACES = re.compile(r" +")
_INT_VALUE = re.compile(r"-?[0-9]+i")
_UINT_VALUE = re.compile(r"[0-9]+u")
_FLOAT_VALUE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# possessive: like nom's many0 it never gives back a consumed escape
_STRING_VALUE = re.compile(r'"((?:[^"\\]+|\\["\\]?)*+)"')
_STRING_UNESCAPE = re.compile(r'\\(["\\])')
_BOOL_VALUE = re.compile(r"true|True|TRUE|t|T|false|False|FALSE|f|F")
_BOOLS = {
    "t": True, "T": True, "true": True, "True": True, "TRUE": True,
    "f": False, "F": False, "false": False, "False": False, "FALSE": False,
}
_TIMESTAMP = re.compile(r"-?[0-9]+")
_TRUE_STRINGS = pa.array(["t", "T", "true", "True", "TRUE"], pa.string())


def _ctx(s: str, pos: int) -> str:
    if pos >= len(s):
        return "end of line"
    rest = s[pos:]
    if len(rest) > 24:
        rest = rest[:24] + "..."
    return repr(rest)


def _too_long(v: str) -> bool:
    return len(v) > MAX_NAME_BYTES // 4 and len(v.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES


def _scan(s: str, pos: int, run, escapes, what: str):
    """IOx ``escape_or_fallback``: returns (unescaped value or None if empty, end)."""
    m = run.match(s, pos)
    if m is not None:
        end = m.end()
        if end == len(s) or s[end] != "\\":  # common case: no escapes at all
            v = m.group()
            if _too_long(v):
                raise _Bad(f"{what} is longer than {MAX_NAME_BYTES} bytes")
            return v, end
        parts = [m.group()]
        pos = end
    else:
        if pos >= len(s) or s[pos] != "\\":
            return None, pos
        parts = []
    n = len(s)
    while True:
        m = run.match(s, pos)
        if m is not None:
            parts.append(m.group())
            pos = m.end()
            continue
        if pos < n and s[pos] == "\\":
            nxt = pos + 1
            if nxt < n and s[nxt] in escapes:
                parts.append(s[nxt])
                pos = nxt + 1
            else:
                # unknown escape: keep the backslash and the next character as they are
                parts.append("\\")
                if nxt < n:
                    parts.append(s[nxt])
                    pos = nxt + 1
                else:
                    pos = nxt
                    break
            continue
        break
    v = "".join(parts)
    if v.endswith("\\"):
        raise _Bad(f"{what} {v!r} ends with a backslash; measurements, tag keys, tag values "
                   "and field keys may not end with a backslash")
    if _too_long(v):
        raise _Bad(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return v, pos


def _int_of(text: str, lo: int, hi: int):
    """int(text) if lo <= value <= hi else None (never trips Python's digit limit)."""
    digits = text.lstrip("-").lstrip("0")
    if len(digits) > 20:
        return None
    v = int(digits) if digits else 0
    if text[0] == "-":
        v = -v
    return v if lo <= v <= hi else None


def _field_value(s: str, pos: int):
    """IOx ``field_value``: (type, value, end), None if no value parses (a nom Error);
    raises _Bad where IOx fails hard (range / size)."""
    m = _INT_VALUE.match(s, pos)
    if m is not None:
        text = m.group()[:-1]
        v = _int_of(text, _I64_MIN, _I64_MAX)
        if v is None:
            raise _Bad(f"integer field value {_short(text)}i is out of the int64 range "
                       f"[{_I64_MIN}, {_I64_MAX}]")
        return "integer", v, m.end()
    m = _UINT_VALUE.match(s, pos)
    if m is not None:
        text = m.group()[:-1]
        v = _int_of(text, 0, _U64_MAX)
        if v is None:
            raise _Bad(f"unsigned field value {_short(text)}u is out of the uint64 range [0, {_U64_MAX}]")
        return "uinteger", v, m.end()
    m = _FLOAT_VALUE.match(s, pos)
    if m is not None:
        return "float", float(m.group()), m.end()
    if pos < len(s) and s[pos] == '"':
        m = _STRING_VALUE.match(s, pos)
        if m is None:
            return None
        v = m.group(1)
        if "\\" in v:
            v = _STRING_UNESCAPE.sub(r"\1", v)
        if _too_long(v):
            raise _Bad(f"string field value is longer than {MAX_NAME_BYTES} bytes")
        return "string", v, m.end()
    m = _BOOL_VALUE.match(s, pos)
    if m is not None:
        return "boolean", _BOOLS[m.group()], m.end()
    return None


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


_FIELD_HINT = ("a field is key=value, the value a float (1.5, -2, 1e3), integer (7i), "
               "unsigned (7u), string (\"text\") or boolean (true/false)")


def _parse_line(s: str):
    """Parse one logical line (non-empty, no leading whitespace, not a comment).

    Returns (measurement, [(tag key, value)], [(field key, type, value)], timestamp or
    None, raw) where raw holds the measurement, tag keys and field keys as written.
    Raises _Bad with the reason.
    """
    n = len(s)
    meas, pos = _scan(s, 0, _MEAS_RUN, _MEAS_ESCAPES, "measurement")
    if meas is None:
        if s[0] == ",":
            raise _Bad("missing measurement name before the first ','")
        raise _Bad(f"invalid measurement name at {_ctx(s, 0)} (NUL characters are not allowed)")
    raw = [s[:pos]]
    tags = []
    if pos < n and s[pos] == ",":
        while True:
            pos += 1
            key, p = _scan(s, pos, _KEY_RUN, _KEY_ESCAPES, "tag key")
            raw.append(s[pos:p])
            if key is None:
                raise _Bad(f"expected a tag key after ',', got {_ctx(s, pos)}")
            if p >= n or s[p] != "=":
                raise _Bad(f"tag set malformed: no '=' after tag key {key!r} "
                           f"(tags are key=value; escape ',', '=' and ' ' with '\\')")
            val, p2 = _scan(s, p + 1, _TAGVAL_RUN, _KEY_ESCAPES, "tag value")
            if val is None:
                raise _Bad(f"tag {key!r} has an empty value, got {_ctx(s, p + 1)} after '=' "
                           "(empty tag values are not allowed; omit the tag instead)")
            tags.append((key, val))
            pos = p2
            if pos >= n or s[pos] != ",":
                break
    m = _SPACES.match(s, pos)
    if m is None:
        if pos >= n:
            raise _Bad(f"no field set: a line needs a space and at least one field after the "
                       f"measurement/tags ({_FIELD_HINT})")
        raise _Bad(f"expected a space between the measurement/tags and the field set, got {_ctx(s, pos)}")
    pos = m.end()
    fields = []
    while True:
        start = pos
        key, p = _scan(s, pos, _KEY_RUN, _KEY_ESCAPES, "field key")
        val = None
        if key is not None and p < n and s[p] == "=":
            val = _field_value(s, p + 1)
        if val is None:
            # IOx: "No fields were provided" for the first field, trailing content after
            # a later one; either way the line is invalid.
            if key is None:
                where = "after ','" if fields else "at the start of the field set"
                raise _Bad(f"expected a field key {where}, got {_ctx(s, start)}; {_FIELD_HINT}")
            if p >= n or s[p] != "=":
                raise _Bad(f"field {key!r} has no '=' and value (got {_ctx(s, p)}); {_FIELD_HINT}")
            raise _Bad(f"invalid value for field {key!r}: {_ctx(s, p + 1)}; {_FIELD_HINT}")
        fields.append((key, val[0], val[1]))
        raw.append(s[start:p])
        pos = val[2]
        if pos < n and s[pos] == ",":
            pos += 1
            continue
        break
    ts = None
    if pos < n:
        m = _SPACES.match(s, pos)
        if m is None:
            raise _Bad(f"invalid value for field {key!r}: unexpected {_ctx(s, pos)} after "
                       f"{s[p + 1:pos]!r}; {_FIELD_HINT}")
        m2 = _TIMESTAMP.match(s, m.end())
        if m2 is None:
            if m.end() == n:
                raise _Bad("trailing space after the field set: spaces may only follow a timestamp")
            raise _Bad(f"expected an integer timestamp after the field set, got {_ctx(s, m.end())}")
        text = m2.group()
        ts = _int_of(text, _I64_MIN, _I64_MAX)
        if ts is None:
            raise _Bad(f"timestamp {_short(text)} does not fit in a signed 64-bit integer")
        pos = m2.end()
        m3 = _SPACES.match(s, pos)
        if m3 is not None:
            pos = m3.end()
        if pos < n:
            if m3 is None:
                raise _Bad(f"invalid timestamp: unexpected {_ctx(s, pos)} after {text!r} "
                           "(timestamps are integers)")
            raise _Bad(f"unexpected {_ctx(s, pos)} after the timestamp")
    return meas, tags, fields, ts, raw


# --------------------------------------------------------------------------
# Line splitting (IOx split_lines) and trimming
# --------------------------------------------------------------------------

_SPLIT_TOKEN = re.compile(r'[\\ =,"]')


def _split_state(seg: str, quoted: bool, fields: bool, equals: int, commas: int):
    """Run IOx's split_lines state machine over one newline-free segment.

    Returns (quoted, fields, equals, commas, ends_in_escape)."""
    skip = -1
    for m in _SPLIT_TOKEN.finditer(seg):
        p = m.start()
        if p == skip:
            continue
        c = seg[p]
        if c == "\\":
            skip = p + 1
        elif c == " ":
            fields = True
        elif fields:
            if c == '"':
                if equals > commas:
                    quoted = not quoted
            elif not quoted:
                if c == "=":
                    equals += 1
                else:
                    commas += 1
    return quoted, fields, equals, commas, skip == len(seg)


def _trim_leading(s: str) -> str:
    """IOx trim_leading: drop leading spaces/tabs/newlines and whole comments."""
    while True:
        s = s.lstrip(" \t\n")
        if s[:1] != "#":
            return s
        i = s.find("\n")
        if i < 0:
            return ""
        s = s[i:]


_SURROGATE = re.compile("[\udc80-\udcff]")


# --------------------------------------------------------------------------
# Shapes: one compiled regular expression per (measurement, tag keys, field keys+types)
# --------------------------------------------------------------------------

# Each group captures exactly what the full parser would read there (a tag value:
# normal characters or a backslash and any character; a string: IOx's escapes).  The
# groups are possessive (nothing after them could match what they give back, so this
# changes no match, it only saves backtracking) and, for speed, not bounded: the
# unescaped lengths (64 KiB), trailing backslashes and integer/timestamp ranges are
# checked per column at the end, and the rows that fail are parsed again by the full
# parser for the exact error.
_TAGVAL_GROUP = r"((?:[^ \t\n,\\]++|\\.)++)"
_VALUE_GROUP = {
    "float": r"(-?[0-9]++(?:\.[0-9]++)?+(?:[eE][+-]?[0-9]++)?+)",
    "integer": r"(-?[0-9]++)i",
    "uinteger": r"([0-9]++)u",
    "string": r'"((?:[^"\\]++|\\["\\]?)*+)"',
    "boolean": r"(t(?:rue)?+|T(?:rue|RUE)?+|f(?:alse)?+|F(?:alse|ALSE)?+)",
}
_TS_GROUP = r"(?: ++(-?[0-9]++) *+)?+\r?"
_MAX_SHAPES = 512  # per request
_MAX_SHAPES_PER_MEASUREMENT = 32
_PATTERN_CACHE: dict[str, object] = {}
_PATTERN_CACHE_SIZE = 4096
_RANGE = {"integer": (_I64_MIN, _I64_MAX), "uinteger": (0, _U64_MAX), "time": (_I64_MIN, _I64_MAX)}
_CAST = {"integer": pa.int64(), "uinteger": pa.uint64(), "time": pa.int64()}


def _re2_group(group: str) -> str:
    """The RE2 twin of one of the groups above (pyarrow.compute.extract_regex): its capture
    named by a `{g}` placeholder, possessive quantifiers made plain (they change no match)."""
    plain = group.replace("++", "+").replace("*+", "*").replace("?+", "?")
    return re.sub(r"\((?!\?)", "(?P<{g}>", plain, count=1)


# Only for bodies without quotes or backslashes (see _bulk_match), so there is no string
# field, and the escape alternative of a tag value never matches.
_TAGVAL_GROUP_RE2 = _re2_group(_TAGVAL_GROUP)
_VALUE_GROUP_RE2 = {t: _re2_group(g) for t, g in _VALUE_GROUP.items() if t != "string"}
_TS_GROUP_RE2 = _re2_group(_TS_GROUP)
#: a body with at least this many segments after a shape's first line has the rest of its
#: lines matched against that shape at once, in Arrow (RE2, without the GIL)
_BULK_MIN_SEGMENTS = 64

_TAG_UNESCAPE = r"\\([\\,= ])"  # (RE2, for pyarrow.compute)
_STRING_UNESCAPE_RE2 = r'\\(["\\])'


def _shape_matcher(raw_meas: str, raw_tag_keys, raw_fields):
    """fullmatch of the regex for lines spelled like this (names as written)."""
    parts = [re.escape(raw_meas)]
    for k in raw_tag_keys:
        parts.append("," + re.escape(k) + "=" + _TAGVAL_GROUP)
    parts.append(" ++")
    for i, (k, t) in enumerate(raw_fields):
        parts.append(("," if i else "") + re.escape(k) + "=" + _VALUE_GROUP[t])
    parts.append(_TS_GROUP)
    src = "".join(parts)
    fm = _PATTERN_CACHE.get(src)
    if fm is None:
        if len(_PATTERN_CACHE) >= _PATTERN_CACHE_SIZE:
            _PATTERN_CACHE.clear()
        fm = _PATTERN_CACHE[src] = re.compile(src).fullmatch
    return fm


def _shape_matcher_re2(raw_meas: str, raw_tag_keys, raw_fields) -> str | None:
    """The RE2 twin of `_shape_matcher` (anchored, named groups g0..), or None for a string field."""
    if any(t == "string" for _, t in raw_fields):
        return None
    parts = ["^", re.escape(raw_meas)]
    g = 0
    for k in raw_tag_keys:
        parts.append("," + re.escape(k) + "=" + _TAGVAL_GROUP_RE2.format(g=f"g{g}"))
        g += 1
    parts.append(" +")
    for i, (k, t) in enumerate(raw_fields):
        parts.append(("," if i else "") + re.escape(k) + "=" + _VALUE_GROUP_RE2[t].format(g=f"g{g}"))
        g += 1
    parts.append(_TS_GROUP_RE2.format(g=f"g{g}") + "$")
    return "".join(parts)


class _Shape:
    __slots__ = ("table", "fm", "re2", "spec", "rows", "ids", "bulk", "bulk_ids")

    def __init__(self, table, fm, spec, re2=None):
        self.table = table
        self.fm = fm
        self.re2 = re2  # the RE2 twin of fm (None: no bulk matching)
        self.spec = spec  # [(column, role, type)] per regex group, the timestamp last
        self.rows = []  # captured strings, len(spec) per row, flattened
        self.ids = []  # index of the line's segment in the body (row order, recheck)
        #: rows matched in bulk (_bulk_match): per group, string arrays; their segment indices
        self.bulk: list[list] = [[] for _ in spec]
        self.bulk_ids: list[int] = []

    def has_rows(self) -> bool:
        return bool(self.ids or self.bulk_ids)

    def arrays(self, req):
        """Validate and convert the captured strings: {column: pa.Array}."""
        k = len(self.spec)
        rows = self.rows
        cols = [pa.array(rows[j::k], pa.string()) for j in range(k)]
        if self.bulk_ids:
            cols = [pa.concat_arrays([cols[j]] + self.bulk[j]) for j in range(k)]
            rows = None  # the texts of the range checks below come from `cols`
            # both lists ascend; they interleave when the loop took a line the bulk match left
            interleaved = self.ids and self.ids[-1] > self.bulk_ids[0]
            ids = self.ids + self.bulk_ids
            if interleaved:
                order = sorted(range(len(ids)), key=ids.__getitem__)
                cols = [c.take(pa.array(order, pa.int64())) for c in cols]
                ids = [ids[r] for r in order]
            self.ids, self.bulk_ids, self.bulk = ids, [], [[] for _ in self.spec]
        suspects = set()
        mult = req.mult
        for j, (name, role, typ) in enumerate(self.spec):
            arr = cols[j]
            if typ == "string":  # tags and string fields: escapes, 64 KiB
                if pc.any(pc.match_substring(arr, "\\")).as_py():
                    if role == "tag":
                        arr = cols[j] = pc.replace_substring_regex(arr, _TAG_UNESCAPE, r"\1")
                        ends = pc.ends_with(arr, "\\")
                        if pc.any(ends).as_py():
                            suspects.update(pc.indices_nonzero(ends).to_pylist())
                    else:
                        arr = cols[j] = pc.replace_substring_regex(arr, _STRING_UNESCAPE_RE2, r"\1")
                if arr.nbytes > MAX_NAME_BYTES:
                    lens = pc.binary_length(arr)
                    if pc.max(lens).as_py() > MAX_NAME_BYTES:
                        suspects.update(pc.indices_nonzero(pc.greater(lens, MAX_NAME_BYTES)).to_pylist())
            elif typ in _CAST:  # integer, uinteger, time: range
                try:
                    arr = arr.cast(_CAST[typ])
                except (pa.ArrowInvalid, OverflowError):
                    lo, hi = _RANGE[typ]
                    if typ == "time" and mult != 1:
                        lo, hi = -(_I64_MAX // mult), _I64_MAX // mult
                    for r, text in enumerate(rows[j::k] if rows is not None else cols[j].to_pylist()):
                        if text is not None and len(text) > 8 and _int_of(text, lo, hi) is None:
                            suspects.add(r)
                    continue
                if typ == "time" and mult != 1 and len(arr) > arr.null_count:
                    lo, hi = -(_I64_MAX // mult), _I64_MAX // mult
                    mm = pc.min_max(arr)
                    if mm["min"].as_py() < lo or mm["max"].as_py() > hi:
                        out_of_range = pc.or_(pc.less(arr, lo), pc.greater(arr, hi))
                        suspects.update(pc.indices_nonzero(pc.fill_null(out_of_range, False)).to_pylist())
        if suspects:
            bad = set()
            for r in sorted(suspects):
                reason = req.recheck(self.ids[r])
                if reason is not None:
                    bad.add(r)
                    req.errors.append(LineError(req.line_number(self.ids[r]), reason))
            if bad:
                keep = pa.array([r not in bad for r in range(len(self.ids))], pa.bool_())
                cols = [c.filter(keep) for c in cols]
                self.ids = [i for r, i in enumerate(self.ids) if r not in bad]
        out = {}
        for j, (name, role, typ) in enumerate(self.spec[:-1]):
            arr = cols[j]
            if typ == "float":
                try:
                    arr = arr.cast(pa.float64())
                except (pa.ArrowInvalid, ValueError):
                    # over/underflow: Python's float() gives +/-inf or 0.0 like IOx
                    arr = pa.array([float(v) for v in arr.to_pylist()], pa.float64())
            elif typ == "integer":
                arr = arr.cast(pa.int64())
            elif typ == "uinteger":
                arr = arr.cast(pa.uint64())
            elif typ == "boolean":
                arr = pc.is_in(arr, value_set=_TRUE_STRINGS)
            out[name] = arr
        ts = cols[-1].cast(pa.int64())
        if mult != 1:
            ts = pc.multiply(ts, pa.scalar(mult, pa.int64()))
        if ts.null_count:
            ts = pc.fill_null(ts, pa.scalar(req.default_time, pa.int64()))
        out["time"] = ts
        return out


class _Table:
    __slots__ = ("name", "schema", "shapes", "gen_ids", "gen_cols", "gen_time")

    def __init__(self, name: str):
        self.name = name
        self.schema = {"time": ("time", "time")}  # column -> (role, type)
        self.shapes = []
        self.gen_ids = []  # rows from the full parser: segment index (row order)
        self.gen_cols = {}  # column -> values (None-padded up to the row they appear in)
        self.gen_time = []

    def add_generic(self, order: int, tags, fields, ts: int):
        n = len(self.gen_ids)
        cols = self.gen_cols
        for k, v in chain(tags, ((k, v) for k, _, v in fields)):
            lst = cols.get(k)
            if lst is None:
                lst = cols[k] = [None] * n
            elif len(lst) < n:
                lst.extend([None] * (n - len(lst)))
            lst.append(v)
        self.gen_ids.append(order)
        self.gen_time.append(ts)

    def generic_arrays(self):
        n = len(self.gen_ids)
        out = {}
        for k, lst in self.gen_cols.items():
            if len(lst) < n:
                lst.extend([None] * (n - len(lst)))
            out[k] = pa.array(lst, _ARROW_TYPE[self.schema[k][1]])
        out["time"] = pa.array(self.gen_time, pa.int64())
        return out

    def finish(self, req) -> tuple[TableBatch | None, int]:
        schema = self.schema
        tag_names = sorted(k for k, (r, _) in schema.items() if r == "tag")
        field_names = sorted(k for k, (r, _) in schema.items() if r == "field")
        specs = ([ColumnSpec(k, "tag", "string") for k in tag_names]
                 + [ColumnSpec(k, "field", schema[k][1]) for k in field_names]
                 + [ColumnSpec("time", "time", "time")])
        parts = []
        for sh in self.shapes:
            if sh.has_rows():
                arrays = sh.arrays(req)
                if sh.ids:
                    parts.append((sh.ids, arrays))
        if self.gen_ids:
            parts.append((self.gen_ids, self.generic_arrays()))
        if not parts:
            return None, 0
        parts.sort(key=lambda p: p[0][0])
        in_order = all(parts[i][0][-1] < parts[i + 1][0][0] for i in range(len(parts) - 1))
        arrays = []
        for spec in specs:
            typ = _ARROW_TYPE[spec.type]
            chunks = []
            for ids, arrs in parts:
                a = arrs.get(spec.name)
                chunks.append(a if a is not None else pa.nulls(len(ids), typ))
            arrays.append(chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, typ))
        data = pa.Table.from_arrays(arrays, names=[s.name for s in specs])
        if not in_order:
            ids = pa.array(list(chain.from_iterable(p[0] for p in parts)), pa.int64())
            data = data.take(pc.sort_indices(ids))
        return TableBatch(self.name, specs, data), data.num_rows


# --------------------------------------------------------------------------
# The request-level driver
# --------------------------------------------------------------------------

def _describe(role: str, typ: str) -> str:
    if role == "tag":
        return "a tag"
    if role == "time":
        return "the time column"
    return f"a {typ} field"


class _Request:
    def __init__(self, segs, precision: str, default_time: int, shapes: bool):
        self.segs = segs
        self.mult = _MULTIPLIER[precision]
        self.precision = precision
        self.default_time = default_time
        self.use_shapes = shapes
        self.tables: dict[str, _Table] = {}
        self.errors: list[LineError] = []
        self.shape_by_key: dict = {}
        self.shapes_by_meas: dict[str, list[_Shape]] = {}
        self.n_shapes = 0
        # segments that are not counted as lines (blank, comment, continuation):
        # (index of the next segment, number of such segments before it)
        self.skip_index: list[int] = []
        self.skip_count: list[int] = []

    def line_number(self, seg_index: int) -> int:
        """1-based line number of the line starting at segment ``seg_index``."""
        k = bisect_right(self.skip_index, seg_index)
        return seg_index + 1 - (self.skip_count[k - 1] if k else 0)

    def _parse(self, s: str):
        meas, tags, fields, ts, raw = _parse_line(s)
        if ts is None:
            ts = self.default_time
        elif self.mult != 1:
            ts *= self.mult
            if not _I64_MIN <= ts <= _I64_MAX:
                raise _Bad(f"timestamp {ts // self.mult} with precision '{self.precision}' "
                           "does not fit in signed 64-bit nanoseconds")
        return meas, tags, fields, ts, raw

    def recheck(self, seg_index: int):
        """The full parser's verdict on a line the fast path matched: reason or None."""
        s = self.segs[seg_index]
        if s[-1:] == "\r":
            s = s[:-1]
        s = _trim_leading(s)
        try:
            self._parse(s)
        except _Bad as e:
            return e.args[0]
        return None

    def line(self, s: str, ln: int, order: int):
        """Full path for one trimmed, non-empty logical line. Returns the _Shape the
        row went to (for the caller's fast path) or None."""
        try:
            meas, tags, fields, ts, raw = self._parse(s)
            table = self.tables.get(meas)
            nf = len(fields)
            fields = self._check(meas, table, tags, fields)
        except _Bad as e:
            self.errors.append(LineError(ln, e.args[0]))
            return None
        if table is None:
            table = self.tables[meas] = _Table(meas)
        schema = table.schema
        for k, _ in tags:
            schema[k] = ("tag", "string")
        for k, t, _ in fields:
            schema[k] = ("field", t)
        shape = None
        # No shapes for lines with a field repeated, over several segments, or with ','
        # in a field key as written: for the others a segment that a shape's regex matches
        # is also a whole line for IOx's line splitter (an unescaped ',' in a field key
        # upsets its quote tracking, which counts '=' and ',' to tell a string value's
        # opening quote).
        if (self.use_shapes and len(fields) == nf and "\n" not in s
                and not any("," in k for k in raw[1 + len(tags):])):
            shape = self._shape(table, meas, tags, fields, raw)
        if shape is not None:
            m = shape.fm(s)
            if m is not None:
                shape.rows.extend(m.groups())
                shape.ids.append(order)
                return shape
        table.add_generic(order, tags, fields, ts)
        return shape

    def _check(self, meas: str, table, tags, fields):
        """The write-step checks; returns the fields with duplicates resolved."""
        schema = table.schema if table is not None else None
        seen = set()
        for k, _ in tags:
            if k in seen:
                raise _Bad(f"tag key {k!r} appears more than once in the line")
            seen.add(k)
            if k == "time":
                raise _Bad("tag key 'time' is not allowed: 'time' is the timestamp column")
            if schema is not None:
                ex = schema.get(k)
                if ex is not None and ex[0] != "tag":
                    raise _Bad(f"table {meas!r}: column {k!r} is {_describe(*ex)} in earlier lines "
                               f"of this request but a tag (string) in this line")
        if len(fields) == 1:
            k, t, _ = fields[0]
            self._check_field(meas, schema, seen, k, t)
            return fields
        fseen = {}
        out = []
        for k, t, v in reversed(fields):
            prev = fseen.get(k)
            if prev is not None:
                if prev == t:
                    continue  # the last occurrence wins
                raise _Bad(f"field {k!r} appears more than once in the line with different "
                           f"types ({t} and {prev})")
            fseen[k] = t
            self._check_field(meas, schema, seen, k, t)
            out.append((k, t, v))
        out.reverse()
        return out

    @staticmethod
    def _check_field(meas, schema, tag_keys, k, t):
        if k in tag_keys:
            raise _Bad(f"{k!r} is used as both a tag and a field in the line")
        if k == "time":
            raise _Bad("field key 'time' is not allowed: 'time' is the timestamp column")
        if schema is not None:
            ex = schema.get(k)
            if ex is not None and (ex[0] != "field" or ex[1] != t):
                raise _Bad(f"table {meas!r}: column {k!r} is {_describe(*ex)} in earlier lines "
                           f"of this request but a {t} field in this line")

    def _shape(self, table, meas, tags, fields, raw):
        nt = len(tags)
        raw_fields = tuple((k, t) for k, (_, t, _) in zip(raw[1 + nt:], fields))
        key = (raw[0], tuple(raw[1:1 + nt]), raw_fields)
        shape = self.shape_by_key.get(key)
        if shape is not None or key in self.shape_by_key:
            return shape
        lst = self.shapes_by_meas.setdefault(_MEAS_PREFIX.match(raw[0]).group(), [])
        if self.n_shapes >= _MAX_SHAPES or len(lst) >= _MAX_SHAPES_PER_MEASUREMENT:
            self.shape_by_key[key] = None
            return None
        spec = [(k, "tag", "string") for k, _ in tags] + [(k, "field", t) for k, t, _ in fields]
        spec.append(("time", "time", "time"))
        shape = _Shape(table, _shape_matcher(raw[0], raw[1:1 + nt], raw_fields), spec,
                       _shape_matcher_re2(raw[0], raw[1:1 + nt], raw_fields))
        self.shape_by_key[key] = shape
        lst.append(shape)
        table.shapes.append(shape)
        self.n_shapes += 1
        return shape

    def result(self) -> ParseResult:
        tables = {}
        lines = 0
        for name, t in self.tables.items():
            batch, n = t.finish(self)
            if batch is not None:
                tables[name] = batch
                lines += n
        self.errors.sort(key=lambda e: e.line_number)
        return ParseResult(tables, self.errors, lines)


_MEAS_PREFIX = re.compile(r"[^ ,]*")
_NO_MATCH = re.compile(r"(?!)").fullmatch


def _run(text: str, precision: str, default_time: int, fast: bool, bad_utf8: bool) -> ParseResult:
    segs = text.split("\n")
    req = _Request(segs, precision, default_time, fast and not bad_utf8)
    use_shapes = req.use_shapes
    special = '"' in text or "\\" in text
    skipped = 0  # segments so far that are not counted as lines
    fm = _NO_MATCH
    rows_extend = ids_append = None
    shapes_by_meas = req.shapes_by_meas
    it = iter(segs)
    i = -1
    #: segments whose rows were taken in bulk (None until then; see _bulk_match)
    taken = None
    bulk_tried = not use_shapes or special or len(segs) < _BULK_MIN_SEGMENTS
    for line in it:
        i += 1
        if taken is not None and taken[i]:
            continue
        if use_shapes:
            m = fm(line)
            if m is not None:
                rows_extend(m.groups())
                ids_append(i)
                continue
            cands = shapes_by_meas.get(_MEAS_PREFIX.match(line).group())
            if cands:
                for sh in cands:
                    m = sh.fm(line)
                    if m is not None:
                        fm = sh.fm
                        rows_extend = sh.rows.extend
                        ids_append = sh.ids.append
                        rows_extend(m.groups())
                        ids_append(i)
                        break
                if m is not None:
                    continue
        # the full path
        first = i
        if special and ('"' in line or "\\" in line):
            line, extra = _join_continuations(line, it)
            i += extra
        else:
            extra = 0
        if line[-1:] == "\r":
            line = line[:-1]
        s = _trim_leading(line)
        if not s:
            skipped += 1 + extra
            req.skip_index.append(i + 1)
            req.skip_count.append(skipped)
            continue
        ln = first + 1 - skipped
        if extra:
            skipped += extra
            req.skip_index.append(i + 1)
            req.skip_count.append(skipped)
        if bad_utf8 and _SURROGATE.search(s):
            req.errors.append(LineError(ln, "the line is not valid UTF-8"))
            continue
        sh = req.line(s, ln, first)
        if sh is not None:
            fm = sh.fm
            rows_extend = sh.rows.extend
            ids_append = sh.ids.append
            if not bulk_tried and len(segs) - i - 1 >= _BULK_MIN_SEGMENTS and sh.re2 is not None:
                bulk_tried = True
                taken = _bulk_match(sh, segs, i + 1, "\r" in text)
    return req.result()


def _bulk_match(sh: _Shape, segs: list, start: int, crlf: bool) -> list | None:
    """Matches segs[start:] against the shape's RE2 twin at once; adds the matching rows to the shape.

    Returns, per segment, whether its row was taken (None if none was). Only for bodies with no
    quote and no backslash, so a segment is a whole line, the twin matches exactly what `sh.fm`
    matches, and a matching line is its measurement, tags, fields and timestamp as tokens
    separated by single commas or runs of spaces, no token holding either (tag values may hold
    "=", keys may not). The twin only says whether a line matches (a DFA, no captures: several
    times cheaper than extracting its groups); the values are cut out of the tokens, whose
    positions the shape fixes: token j + 1 is "key=value" of group j, the timestamp is the last.
    A matching line with a run of two or more spaces, or a trailing space after its timestamp,
    gives empty tokens: it is not taken here, nor are lines without a timestamp in a body whose
    matching lines have one (and vice versa); the line loop takes them as before.
    """
    lines = pa.array(segs[start:], pa.string())
    ok = pc.match_substring_regex(lines, sh.re2)
    if not ok.true_count:
        return None
    if crlf:  # a matching line ends in at most one "\r", and no token before the last holds one
        lines = pc.utf8_rtrim(lines, "\r")
    tokens = pc.split_pattern(pc.replace_substring(lines, ",", " "), " ")
    n = len(sh.spec) + 1  # the measurement, the groups, the timestamp
    counts = pc.list_value_length(tokens)
    take = pc.and_(ok, pc.equal(counts, n))
    with_ts = bool(take.true_count)
    if not with_ts:
        take = pc.and_(ok, pc.equal(counts, n - 1))
        if not take.true_count:
            return None
    taken = tokens if take.true_count == len(take) else tokens.filter(take)
    if pc.min(pc.binary_length(pc.list_flatten(taken))).as_py() == 0:  # a run of spaces in a line
        take = pc.and_(take, pc.invert(pc.match_substring(lines, "  ")))
        if not take.true_count:
            return None
        taken = tokens.filter(take)
    # pyarrow's binary_slice takes no open stop (and overflows on a huge one): the longest line's
    end = pc.max(pc.binary_length(lines)).as_py()
    for j, (name, _, typ) in enumerate(sh.spec[:-1]):
        # the key as written is the column's name (no backslash in the body); the bytes cut, "key="
        # and an "i"/"u" suffix, are ASCII: the values stay UTF-8
        lo, hi = len(name.encode()) + 1, -1 if typ in ("integer", "uinteger") else end
        value = pc.binary_slice(pc.list_element(taken, j + 1).view(pa.binary()), lo, hi)
        sh.bulk[j].append(value.view(pa.string()))
    sh.bulk[-1].append(pc.list_element(taken, n - 1) if with_ts else pa.nulls(len(taken), pa.string()))
    sh.bulk_ids.extend(pc.add(pc.indices_nonzero(take), start).to_pylist())
    return [False] * start + take.to_pylist()


def _join_continuations(line: str, it):
    """IOx split_lines: extend ``line`` with the following segments while it is inside
    a quoted string or ends in a backslash. Returns (logical line, segments added)."""
    st = _split_state(line, False, False, 0, 0)
    if not (st[0] or st[4]):
        return line, 0
    buf = [line]
    for nxt in it:
        buf.append(nxt)
        st = _split_state(nxt, st[0], st[1], st[2], st[3])
        if not (st[0] or st[4]):
            break
    return "\n".join(buf), len(buf) - 1


def line_protocol_pieces(body, max_bytes: int):
    """Cuts a line protocol body into consecutive pieces ``(start, stop)`` (byte offsets) of at most
    ``max_bytes`` each, every one ending where a line ends by the splitting rules above (a newline
    inside a quoted string field value, or right after a backslash, does not end a line): each
    piece parses as the same lines as they are in the whole body.  A single line longer than
    ``max_bytes`` is a piece of its own (over the limit).  ``body``: bytes, or a buffer with
    ``find``, ``rfind`` and slicing (an ``mmap``).  For writing a large body in several requests.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
    n = len(body)
    start = 0
    while start < n:
        stop = _piece_stop(body, start, n, max_bytes)
        yield start, stop
        start = stop


def _piece_stop(body, start: int, n: int, max_bytes: int) -> int:
    limit = start + max_bytes
    if limit >= n:
        return n
    nl = body.rfind(b"\n", start, limit)
    if nl >= 0 and body.find(b'"', start, nl) < 0 and body.find(b"\\", start, nl) < 0:
        return nl + 1  # no quote, no backslash: every newline ends a line
    stop = None
    for end in _line_ends(body, start, n):
        if stop is not None and end > limit:
            break
        stop = end
        if end >= limit:
            break
    return n if stop is None else stop


def _line_ends(body, start: int, n: int):
    """Offsets just past each newline of ``body[start:n]`` that ends a line (``start`` starts one),
    then ``n`` when the body does not end in such a newline."""
    pos = start
    state = None  # the split state inside a line continued past a newline, else None
    while pos < n:
        nl = body.find(b"\n", pos, n)
        if nl < 0:
            break
        seg = body[pos:nl]
        pos = nl + 1
        if state is not None or b'"' in seg or b"\\" in seg:
            quoted, fields, equals, commas, escaped = _split_state(seg.decode("latin-1"),
                                                                   *(state or (False, False, 0, 0)))
            if quoted or escaped:
                state = (quoted, fields, equals, commas)
                continue
        state = None
        yield pos
    if pos < n or state is not None:
        yield n


def numbered_lines(body: bytes) -> list:
    """[(line number, start, stop)] of the lines of `body` that count (not blank, not a comment):
    the numbers ``LineError.line_number`` gives, and the byte span of each line (its newline
    included), split by the rules above."""
    out, start, n = [], 0, 0
    for end in _line_ends(body, 0, len(body)):
        text = body[start:end].decode("utf-8", "replace")
        if text.endswith("\n"):
            text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
        if _trim_leading(text):
            n += 1
            out.append((n, start, end))
        start = end
    return out


def parse_lines(body: bytes | str, precision: str = "ns", default_time_ns: int | None = None) -> ParseResult:
    """Parse a line protocol request body into per-table Arrow batches.

    ``precision`` scales timestamps to nanoseconds; a line without a timestamp
    gets ``default_time_ns`` (the time of receipt; ``time.time_ns()`` if None).
    Every bad line is reported in ``errors`` (callers reject the request then;
    ``tables`` may be partial).
    """
    return _parse(body, precision, default_time_ns, fast=True)


def _parse(body, precision, default_time_ns, fast: bool) -> ParseResult:
    if precision not in _MULTIPLIER:
        raise ValueError(f"precision must be one of {', '.join(ALL_PRECISIONS)}, got {precision!r}")
    if default_time_ns is None:
        default_time_ns = _time.time_ns()
    if fast and _lpfast is not None:
        res = _parse_c(body, precision, default_time_ns)
        if res is not None:
            return res
    bad_utf8 = False
    if isinstance(body, str):
        text = body
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates
                bad_utf8 = True
    else:
        if not isinstance(body, bytes):
            body = bytes(body)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = body.decode("utf-8", "surrogateescape")
            bad_utf8 = True
    return _run(text, precision, int(default_time_ns), fast, bad_utf8)


# --------------------------------------------------------------------------
# The C path (server/write/_lpfast.c)
# --------------------------------------------------------------------------

#: _lpfast column kinds -> (role, type)
_C_KINDS = (("tag", "string"), ("field", "float"), ("field", "integer"), ("field", "uinteger"),
            ("field", "string"), ("field", "boolean"))
_TIME_SPEC = ColumnSpec("time", "time", "time")


def _parse_c(body, precision: str = "ns", default_time_ns: int | None = None) -> ParseResult | None:
    """The C path alone: the result, or None when it falls back (a bad line, invalid UTF-8,
    something it leaves to the Python path, or the extension is not built)."""
    if _lpfast is None or precision not in _MULTIPLIER:
        return None
    if default_time_ns is None:
        default_time_ns = _time.time_ns()
    default_time_ns = int(default_time_ns)
    if not _I64_MIN <= default_time_ns <= _I64_MAX:
        return None
    if not isinstance(body, (bytes, str)):
        try:
            body = bytes(body)
        except Exception:  # the Python path raises it
            return None
    out = _lpfast.parse(body, _MULTIPLIER[precision], default_time_ns)
    if out is None:
        return None
    tables = {}
    lines = 0
    py_buffer, from_buffers = pa.py_buffer, pa.Array.from_buffers
    for name, n, unique, cols, time_values in out:
        specs, arrays = [], []
        for cname, kind, values, offsets, validity, nulls in cols:
            role, typ = _C_KINDS[kind]
            specs.append(ColumnSpec(cname, role, typ))
            bufs = [None if validity is None else py_buffer(validity)]
            if offsets is not None:
                bufs.append(py_buffer(offsets))
            bufs.append(py_buffer(values))
            arrays.append(from_buffers(_ARROW_TYPE[typ], n, bufs, null_count=nulls))
        specs.append(_TIME_SPEC)
        arrays.append(from_buffers(pa.int64(), n, [None, py_buffer(time_values)], null_count=0))
        data = pa.Table.from_arrays(arrays, names=[s.name for s in specs])
        tables[name] = TableBatch(name, specs, data, unique)
        lines += n
    return ParseResult(tables, [], lines)
