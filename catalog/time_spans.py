"""Time spans: where in time a chunk's rows lie, finer than its [min, max] hull.

A span set is a tuple of inclusive (lo_ns, hi_ns) ranges, sorted and pairwise
disjoint (each hi < the next lo). Invariant kept by every function here: a
chunk's span set covers every row's time (it may cover more: coarsening is
always safe, narrowing never is). The empty tuple means "unknown": the chunk's
hull stands in for it (`of_chunk`).

Why: rows in disjoint spans cannot share a (tags, time) key. A micro-batch of
several writers' interleaved requests has a hull that overlaps its
neighbours', while the requests themselves (each with unique keys, see the
router's iox-unique) sit side by side in time; keeping each request's span lets
compaction, persist and the table views know the rows need no deduplication.

Pure functions of values; called on the driver.
"""
from __future__ import annotations

__all__ = ["MAX_TIME_SPANS", "normalize", "of_chunk", "disjoint", "union", "clip"]

#: most spans a chunk keeps; more are coarsened by bridging the smallest gaps (a few KB of driver memory)
MAX_TIME_SPANS = 4096


def normalize(spans, limit: int = MAX_TIME_SPANS) -> tuple:
    """`spans` (any order, may overlap) as a span set: sorted, overlapping ranges joined, at most
    `limit` ranges (the smallest gaps bridged first, so the set stays a cover)."""
    out: list = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    if len(out) > limit:
        # bridge the len(out) - limit smallest gaps (ties: the earliest), keep the rest
        gaps = sorted(range(len(out) - 1), key=lambda i: (out[i + 1][0] - out[i][1], i))
        bridged = set(gaps[:len(out) - limit])
        merged: list = []
        for i, s in enumerate(out):
            if i - 1 in bridged:
                merged[-1] = (merged[-1][0], s[1])
            else:
                merged.append(s)
        out = merged
    return tuple(out)


def of_chunk(chunk) -> tuple:
    """The span set of anything with `time_spans`, `min_time_ns` and `max_time_ns` (a Chunk, a view's
    ChunkSource): its spans, else its hull; () for a chunk without rows (no time range)."""
    spans = getattr(chunk, "time_spans", ())
    if spans:
        return spans
    if chunk.min_time_ns is None:
        return ()
    return ((chunk.min_time_ns, chunk.max_time_ns),)


def disjoint(span_sets) -> bool:
    """No two of `span_sets` (each a span set) meet: no time lies in two of them."""
    flat = sorted(s for spans in span_sets for s in spans)
    return all(flat[i][1] < flat[i + 1][0] for i in range(len(flat) - 1))


def union(span_sets, limit: int = MAX_TIME_SPANS) -> tuple:
    """One span set covering all of `span_sets`."""
    return normalize([s for spans in span_sets for s in spans], limit)


def clip(spans: tuple, lo: int, hi: int) -> tuple:
    """The part of a span set within [lo, hi] (inclusive): a cover of those of its rows in that range."""
    return tuple((max(a, lo), min(b, hi)) for a, b in spans if b >= lo and a <= hi)
