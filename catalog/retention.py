"""Retention: a database's optional retention period and the watermarks derived from it.

Terms (after the watermark system of an indexer with pruning):

* ``reader_lo_ns``: the oldest time guaranteed readable, ``now - period``; queries
  never return a row older than it, and writes of points older than it are refused.
* ``pruner_hi_ns``: every row older than it is gone (its day partitions and Parquet
  files were dropped); ``pruner_hi_ns <= reader_lo_ns`` always, and the pruner runs
  behind ``reader_lo_ns`` by a safety delay (see lifecycle/prune_policy.py).

Invariant: pure functions of their arguments; no clock is read here (callers pass
``now_s``). Used on the driver (router, query engine, lifecycle worker) and by the CLI.
"""
from __future__ import annotations

import re

from iox_spark.catalog.errors import InvalidDuration

__all__ = ["parse_duration_s", "format_duration_s", "reader_lo_ns", "MAX_RETENTION_S", "DURATION_UNITS_S"]

#: seconds per unit of a duration ("30d", "12h", "90m", "3600s"; "w" for weeks)
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
#: the longest retention period accepted (100 years): beyond it nothing is ever older
MAX_RETENTION_S = 100 * 365 * 86_400
_PART = re.compile(r"(\d+)([smhdw])")


def parse_duration_s(text: str | int) -> int:
    """Seconds of a duration: ``"30d"``, ``"12h"``, ``"90m"``, ``"3600s"``, ``"1d12h"``, a bare
    number of seconds (``"3600"``, ``3600``), ``"0"`` (none). Raises InvalidDuration for anything
    else, a negative value, or more than MAX_RETENTION_S."""
    if isinstance(text, bool):
        raise InvalidDuration(text, "not a duration")
    if isinstance(text, int):
        seconds = text
    else:
        t = str(text).strip().lower()
        if not t:
            raise InvalidDuration(text, "empty")
        if t.isdigit():
            seconds = int(t)
        else:
            pos, seconds = 0, 0
            for m in _PART.finditer(t):
                if m.start() != pos:
                    break
                seconds += int(m.group(1)) * DURATION_UNITS_S[m.group(2)]
                pos = m.end()
            if pos != len(t) or pos == 0:
                raise InvalidDuration(text, "expected numbers with units (s, m, h, d, w)")
    if seconds < 0:
        raise InvalidDuration(text, "must not be negative")
    if seconds > MAX_RETENTION_S:
        raise InvalidDuration(text, f"longer than {MAX_RETENTION_S // 86_400} days")
    return seconds


def format_duration_s(seconds: int) -> str:
    """The shortest exact form of a duration (``2592000`` -> ``"30d"``; 0 -> ``"0"``)."""
    if not seconds:
        return "0"
    for unit in ("w", "d", "h", "m"):
        if seconds % DURATION_UNITS_S[unit] == 0:
            return f"{seconds // DURATION_UNITS_S[unit]}{unit}"
    return f"{seconds}s"


def reader_lo_ns(period_s: int | None, now_s: float) -> int | None:
    """The oldest time (ns since the epoch) guaranteed readable at ``now_s`` with a retention of
    ``period_s`` seconds; None without a retention (``period_s`` None or 0)."""
    if not period_s:
        return None
    return int((now_s - period_s) * 1_000_000_000)
