"""InfluxDB 3's `POST /api/v3/write_lp` semantics on the one write path: its precision names and
`auto`, and partial writes.

Invariant: the lines written are written all or nothing, as every request is (one produce,
server/write/router.py). With `accept_partial`, the lines that cannot be written (a line that does
not parse; a column whose type differs from the table's, or from an earlier line's of the
request) are left out before that produce and named in the answer (line number as the parser
counts lines, the line's text, why); the other lines are written. Without it, any such line
refuses the whole request and nothing is written.

`auto` guesses each timestamp's unit from its magnitude as InfluxDB 3 does (|t| / 1e9 below 5:
seconds, below 5,000: milliseconds, below 5,000,000: microseconds, else nanoseconds); a line
without a timestamp takes the server's clock.

Pure helpers (no I/O); the router (`Router.write_lp_v3`) drives them.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["RejectedLine", "V3_PRECISIONS", "parse_precision", "guess_units", "blank_lines", "line_text",
           "type_conflict_message", "column_type_name"]

#: `precision` of /api/v3/write_lp -> the parser's unit (None: `auto`)
V3_PRECISIONS = {"auto": None, "nanosecond": "ns", "microsecond": "us", "millisecond": "ms", "second": "s",
                 "ns": "ns", "us": "us", "ms": "ms", "s": "s"}
_NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class RejectedLine:
    """A line a write_lp request left out (or that refused it)."""

    line_number: int
    original_line: str
    error_message: str

    def as_json(self) -> dict:
        return {"original_line": self.original_line, "line_number": self.line_number,
                "error_message": self.error_message}


def parse_precision(text: str | None) -> str | None:
    """The parser's unit for write_lp's `precision` (None: auto); ValueError naming the choices."""
    key = (text or "auto").strip().lower()
    if key not in V3_PRECISIONS:
        raise ValueError(f"precision must be one of auto, nanosecond, microsecond, millisecond, second "
                         f"(or ns, us, ms, s), got {text!r}")
    return V3_PRECISIONS[key]


def guess_units(times: pa.Array) -> pa.Array:
    """Timestamps read as nanoseconds (int64) scaled to nanoseconds by the unit `auto` guesses for
    each one. No product overflows: each unit's range times its factor stays under 5e18."""
    t = times.cast(pa.int64())
    val = pc.divide(pc.abs(t), _NS_PER_S)  # integer division (truncated), as InfluxDB 3's
    factor = pc.if_else(pc.less(val, 5), 1_000_000_000,
                        pc.if_else(pc.less(val, 5_000), 1_000_000,
                                   pc.if_else(pc.less(val, 5_000_000), 1_000, 1)))
    return pc.multiply(t, factor.cast(pa.int64()))


def blank_lines(body: bytes, spans: list) -> bytes:
    """`body` with each (start, stop) span's line replaced by an empty line (its newline kept):
    the parser skips it, and every other line keeps its text."""
    out, pos = [], 0
    for start, stop in sorted(spans):
        out.append(body[pos:start])
        if body[start:stop].endswith(b"\n"):
            out.append(b"\n")
        pos = stop
    out.append(body[pos:])
    return b"".join(out)


def line_text(body: bytes, start: int, stop: int) -> str:
    """A line's text as a write_lp answer quotes it (no line end)."""
    text = body[start:stop].decode("utf-8", "replace")
    return text.rstrip("\n").rstrip("\r")


def column_type_name(role: str, typ: str) -> str:
    """InfluxDB 3's name of a column type (`iox::column_type::field::float`, `...::tag`)."""
    if role == "tag":
        return "iox::column_type::tag"
    if role == "time":
        return "iox::column_type::timestamp"
    return f"iox::column_type::field::{typ}"


def type_conflict_message(column: str, expected: tuple, got: tuple) -> str:
    """InfluxDB 3's words for a line writing `column` as (role, type) `got` where it is `expected`."""
    return (f"invalid column type for column '{column}', expected {column_type_name(*expected)}, "
            f"got {column_type_name(*got)}")
