"""The write path's retention check: a write holding a point older than its database's
retention allows (older than reader_lo, catalog/retention.py) is rejected whole.

Invariant: nothing of such a request reaches the write buffer (it would be hidden by every
query and then pruned: stored then hidden is what this check prevents); the error names the
first offending line (line protocol) or table row (Arrow), the point's time and the retention
(OlderThanRetention: INVALID_ARGUMENT, HTTP 422 as InfluxDB answers points beyond its retention).

Who calls it: the router (server/write/router.py), in gRPC / HTTP worker threads, with the wall
clock's `now_s` (reader_lo is computed from it, never from a watermark that could lag behind).
"""
from __future__ import annotations

import pyarrow.compute as pc

from iox_spark.catalog.retention import format_duration_s, reader_lo_ns
from iox_spark.server.errors import OlderThanRetention

__all__ = ["check_retention", "first_line_older_than"]

_NS_PER = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}


def check_retention(database: str, period_s: int | None, batches: dict, now_s: float, body: bytes | None = None,
                    precision: str = "ns") -> None:
    """Raises OlderThanRetention when a row of `batches` ({table: (columns, pa.Table with an int64
    ns `time` column, unique)}) is older than reader_lo at `now_s`; `body`/`precision`: the line
    protocol the batches came from (to name the line). No retention: nothing is checked."""
    lo = reader_lo_ns(period_s, now_s)
    if lo is None:
        return
    for table, (_cols, data, _unique) in batches.items():
        t = data.column("time")
        oldest = pc.min(t).as_py()
        if oldest is None or oldest >= lo:
            continue
        line = first_line_older_than(body, precision, lo) if body is not None else None
        row = int(pc.index(pc.less(t, lo), True).as_py())
        raise OlderThanRetention(database, table, oldest, lo, format_duration_s(period_s), line=line, row=row)


def first_line_older_than(body: bytes, precision: str, lo_ns: int) -> int | None:
    """The 1-based number of the first line of `body` whose timestamp (its last field, in
    `precision`) is older than `lo_ns`; None when no line's timestamp is (a point without a
    timestamp takes the server's clock, never older)."""
    mult = _NS_PER.get(precision, 1)
    for n, raw in enumerate(body.split(b"\n"), 1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        last = line.rsplit(None, 1)[-1]
        if last.lstrip(b"-").isdigit() and len(line.split(None)) >= 3:
            if int(last) * mult < lo_ns:
                return n
    return None
