"""Scenario 10: line protocol -> Arrow, lines/s on one core.

Ours: `server.write.line_protocol.parse_lines` (full IOx grammar with a per-shape
fast path) on one body. Baseline: the C package `line-protocol-parser`
(`parse_line` per line -> dicts), flattened to rows, then
`pyarrow.Table.from_pylist` — what a Python user would write.
Both run in this process pinned to one CPU; best of the repeats.
"""
from __future__ import annotations

import os
import time

import pyarrow as pa

from bench.harness import Row, lp_batches, recent_t0_ns


def _ours(body: bytes) -> int:
    from iox_spark.server.write.line_protocol import parse_lines

    r = parse_lines(body)
    assert not r.errors, r.errors[:3]
    return sum(t.data.num_rows for t in r.tables.values())


def _baseline(body: bytes) -> int:
    from line_protocol_parser import parse_line

    rows = []
    for line in body.decode().split("\n"):
        if not line:
            continue
        d = parse_line(line)
        row = {"measurement": d["measurement"], **d["tags"], **d["fields"], "time": d["time"]}
        rows.append(row)
    return pa.Table.from_pylist(rows).num_rows


def _best(fn, body, repeat: int) -> tuple[float, int]:
    best, n = None, 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn(body)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, n


def run(ctx) -> list[Row]:
    n = ctx.sizes["parse_lines"]
    body = b"".join(lp_batches("cpu", n, seed=10, t0_ns=recent_t0_ns()))
    try:
        import line_protocol_parser  # noqa: F401
    except ImportError:
        line_protocol_parser = None
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(old)})
    try:
        t_ours, n_ours = _best(_ours, body, ctx.sizes["repeat"])
        if line_protocol_parser is not None:
            t_base, n_base = _best(_baseline, body, ctx.sizes["repeat"])
        else:
            t_base, n_base = None, 0
    finally:
        os.sched_setaffinity(0, old)
    ours = n_ours / t_ours
    base = n_base / t_base if t_base else None
    r = Row("parse LP -> Arrow (1 core)", "lines/s", ours, "line-protocol-parser (C) + Table.from_pylist", base,
            target=">= 1.0x baseline", size=f"{n:,} lines, one shape (2 tags, 3 fields), best of {ctx.sizes['repeat']}",
            note="" if base else "line-protocol-parser not installed: baseline not measured")
    r.met = r.ratio is not None and r.ratio >= 1.0
    return [r]
