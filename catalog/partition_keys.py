"""Partition keys: a row's partition is the UTC day of its timestamp (IOx's default).

Invariant: `day_numbers` is an exact floor division, also for times before 1970, so
a row lands in the same partition whoever computes its key (the router, the
ingester, the replay). Pure functions; used on the driver and in executors.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["NS_PER_DAY", "partition_key_of_day", "day_number_of_key", "day_numbers", "day_partitions"]

NS_PER_DAY = 86_400 * 1_000_000_000


def partition_key_of_day(day_number: int) -> str:
    import datetime

    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day_number)).isoformat()


def day_number_of_key(partition_key: str) -> int:
    """The day number (days since 1970-01-01) of a partition key: the inverse of
    :func:`partition_key_of_day`. Raises ValueError for a key that is not an ISO date."""
    import datetime

    return (datetime.date.fromisoformat(partition_key) - datetime.date(1970, 1, 1)).days


def day_numbers(time_ns: pa.Array) -> pa.Array:
    """Exact floor(time_ns / NS_PER_DAY) of an int64 array (correct for negative times)."""
    trunc = pc.divide(time_ns, pa.scalar(NS_PER_DAY, pa.int64()))  # integer division truncates
    inexact_negative = pc.and_(pc.less(time_ns, 0), pc.not_equal(pc.multiply(trunc, NS_PER_DAY), time_ns))
    return pc.subtract(trunc, pc.cast(inexact_negative, pa.int64()))


def day_partitions(time_ns: pa.Array) -> dict[str, list[int]]:
    """{partition key (UTC day): [rows, min_time_ns, max_time_ns]} of a time column."""
    mm = pc.min_max(time_ns)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo is None:
        return {}
    if lo // NS_PER_DAY == hi // NS_PER_DAY:  # one day (a request's usual case): no grouping
        return {partition_key_of_day(lo // NS_PER_DAY): [len(time_ns) - time_ns.null_count, lo, hi]}
    tbl = pa.table({"d": day_numbers(time_ns), "t": time_ns})
    g = tbl.group_by("d").aggregate([("t", "count"), ("t", "min"), ("t", "max")]).sort_by("d")
    cols = [g.column(c).to_pylist() for c in ("d", "t_count", "t_min", "t_max")]
    return {partition_key_of_day(d): [n, lo, hi] for d, n, lo, hi in zip(*cols)}
