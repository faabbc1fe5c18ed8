"""Scenarios 6 (query latency), 5 (persist throughput) and 8a (memory per point), and the
Flight report (Arrow Flight DoGet against our gRPC Query).

They share one dataset of N generated points (N = 10M full, less in quick mode), written
through gRPC as 5,000-point line-protocol batches to two tables:

- `qm`: all N points. Server RSS (driver + JVM + workers) is sampled before
  and after: (after - before) / N = bytes per point held in memory. Query
  "all in memory". Then `Persist` (management API) writes it to Parquet:
  persist throughput = rows persisted / call time (flush handle, split,
  Parquet from the executors, one catalog commit). Query "all persisted".
- `qx`: N/2 points, `Persist`, then the other N/2: query "mixed".

Baselines: `pyarrow.parquet.write_table` of the same N rows to the same object
store directory (persist), and plain Spark SQL in a separate Spark
application over the same rows in plain Parquet files (query; run by
`prepare_baseline` right after the end-to-end scenario, while our server is
idle, so the baseline application can stop before our scenarios load it). The query is
a grouped aggregate: per host count, avg, max, sum. Figures are medians of
`query_repeat` runs. Ours are timed once the table is settled: after one warm-up query (which,
on fresh in-memory rows, also makes the lifecycle move them to the read buffer 2 s later), the
bench waits until no chunk of the table is compacted or persisted and its chunks did not change
for `settle_quiet_s` (5 s): a table that is read repeatedly (a dashboard) is read in that state. The
warm-up's latency and the settle wait are kept in the row's `extra` (`first_query_s`,
`settle_s`): the cost of the first query right after a large load. The baseline's Parquet
files never change: one warm-up, then `query_repeat` runs.

Flight: on the persisted `qm`, right after its Query runs, the same grouped aggregate through Arrow
Flight DoGet (InfluxDB 3's ticket), and a raw scan of FLIGHT_SCAN_ROWS rows through both; reported
beside our gRPC Query, no target.
"""
from __future__ import annotations

import os
import statistics
import time

import pyarrow.parquet as pq

from bench.harness import POINTS_PER_BATCH, Laps, Row, gen_table, recent_t0_ns, run_writers, status_partitions, to_line_protocol

DB = "bench_query"
SQL = ("SELECT host, count(*) AS n, avg(usage_user) AS u, max(usage_system) AS s, sum(requests) AS r "
       "FROM {t} GROUP BY host")


def _write(srv, clients: int, batches: list) -> dict:
    st = run_writers(srv.addr, DB, batches, clients, 3600, once=True)
    if st.errors:
        raise RuntimeError(f"loading failed: {st.errors}")
    srv.client.wait_applied(DB, st.token, timeout_s=600)
    return st


#: the table's chunks must be unchanged (ids, states, storage) and none compacted or persisted
#: for the size `settle_quiet_s` before the timed queries (full mode 5 s: more than the 2 s after
#: a query at which a queried table's write-buffer chunks move to the read buffer, plus the
#: lifecycle loop's 1 s; quick mode 3 s, at that bound, to stay under 3 minutes), at most this long
#: (then the queries run anyway, and the row's note says so)
_SETTLE_TIMEOUT_S = 300.0


def _settle(srv, table: str, quiet_s: float) -> tuple[float, bool]:
    """Waits until `table`'s chunks have not changed for `quiet_s` and none is being compacted or
    persisted (at most `_SETTLE_TIMEOUT_S`); returns (seconds waited, settled)."""
    t0 = time.monotonic()
    deadline = t0 + _SETTLE_TIMEOUT_S
    last, since = None, t0
    while True:
        chunks = [(c["id"], c["state"], c.get("storage")) for p in status_partitions(srv.client.status(DB), DB)
                  if p["table"] == table for c in p["chunk_list"]]
        now = time.monotonic()
        busy = any(state in ("compacting", "persisting") for _i, state, _s in chunks)
        if busy or chunks != last:
            last, since = chunks, now
        elif now - since >= quiet_s:
            return now - t0, True
        if now >= deadline:
            return now - t0, False
        time.sleep(0.2)


def _query(srv, table: str, repeat: int, quiet_s: float, expect: dict) -> tuple[list, int, bool, dict]:
    """Latencies of `repeat` runs (s) on the settled table, groups returned, whether every answer
    had the exact count and sum per host of the generated rows (`expect`: host -> (count, sum of
    requests)), and {first_query_s, settle_s, settled} of the warm-up and the wait before the runs."""
    sql = SQL.format(t=table)
    t0 = time.monotonic()
    srv.client.query(DB, sql, timeout_s=600)
    first_s = time.monotonic() - t0
    settle_s, settled = _settle(srv, table, quiet_s)
    times, rows, exact = [], 0, True
    for _ in range(repeat):
        t0 = time.monotonic()
        res = srv.client.query(DB, sql, timeout_s=600)
        times.append(time.monotonic() - t0)
        rows = res.num_rows
        exact = exact and {r["host"]: (r["n"], r["r"]) for r in res.to_pylist()} == expect
    return times, rows, exact, {"first_query_s": round(first_s, 3), "settle_s": round(settle_s, 1), "settled": settled}


def _expected(data) -> dict:
    g = data.group_by("host").aggregate([("requests", "sum"), ("host", "count")]).to_pylist()
    return {r["host"]: (r["host_count"], r["requests_sum"]) for r in g}


def prepare_baseline(ctx) -> None:
    """Generates the scenario's points and runs the plain-Parquet baseline on them (the baseline Spark
    application must be up). The bench calls it right after the end-to-end scenario, while our server
    is idle, so the baseline application can be stopped before the rest of the run (it holds GiBs);
    `run` calls it itself when it was not called."""
    s = ctx.sizes
    n = s["query_points"]
    laps = Laps("query", ctx.timings)
    data = gen_table(n, seed=500, t0_ns=recent_t0_ns(7200))
    laps.lap("generate")
    plain = os.path.join(ctx.tmp, "plain-parquet")
    os.makedirs(plain, exist_ok=True)
    per_file = max(1, n // 4)
    for i, o in enumerate(range(0, n, per_file)):
        pq.write_table(data.slice(o, per_file), os.path.join(plain, f"part-{i}.parquet"))
    base_q = None
    if ctx.worker is not None and ctx.worker.proc.poll() is None:
        r = ctx.worker.call("sql", path=plain, view="qm", query=SQL.format(t="qm"), repeat=s["query_repeat"])
        base_q = r["times"]
    laps.lap("baseline_sql")
    ctx.query_prepared = {"data": data, "base_q": base_q}


def memory_per_point_row(rss0: int, rss1: int, n: int, est_bytes: int, size: str, load_s: float) -> Row:
    """The memory row: the server tree's RSS growth over loading `n` points, per point. Other
    memory moves in the same interval (an earlier scenario's data released, a Python worker
    exiting, the JVM returning heap), so a growth of zero or less is not a figure: the row then
    has none and says so (met False), with the catalog's estimate beside it either way."""
    delta = rss1 - rss0
    grew = delta > 0
    note = (f"RSS delta of the server process tree (driver+JVM+workers) {delta / 2**20:,.0f} MiB; "
            f"catalog estimate {est_bytes / n:.0f} B/point; JVM heap growth is lazy, so this is indicative")
    if not grew:
        note = ("no figure: the server tree's RSS did not grow over the load (other memory was released "
                "meanwhile); " + note)
    return Row("server memory per point held in memory", "bytes/point", delta / n if grew else None,
               target="report", better="lower", size=size, note=note, met=grew,
               extra={"rss_before": rss0, "rss_after": rss1, "load_seconds": load_s})


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    n = s["query_points"]
    if getattr(ctx, "query_prepared", None) is None:
        prepare_baseline(ctx)
    data, base_q = ctx.query_prepared["data"], ctx.query_prepared["base_q"]
    ctx.query_prepared = None
    laps = Laps("query", ctx.timings)
    lp = [to_line_protocol("qm", data.slice(o, POINTS_PER_BATCH)) for o in range(0, n, POINTS_PER_BATCH)]
    laps.lap("line_protocol")
    size = f"{n:,} points, 100 hosts" + ("" if n >= 10_000_000 else " (quick: not 10M)")

    # ---------------------------------------------------------- memory per point
    tok = srv.client.write(DB, lp[0].split(b"\n", 1)[0] + b"\n")  # creates db/table (1 point, counted below)
    srv.client.wait_applied(DB, tok, timeout_s=120)
    rss0 = srv.rss()
    t0 = time.monotonic()
    _write(srv, s["clients"], lp)
    load_s = time.monotonic() - t0
    time.sleep(2)
    rss1 = srv.rss()
    laps.lap("load")
    parts = [p for p in status_partitions(srv.client.status(DB), DB) if p["table"] == "qm"]
    est = sum(p["chunk_bytes"] for p in parts)
    rows = [memory_per_point_row(rss0, rss1, n, est, size, load_s)]

    expect = _expected(data)
    q_mem, nrows, ok_mem, w_mem = _query(srv, "qm", s["query_repeat"], s["settle_quiet_s"], expect)
    laps.lap("query_mem")
    states_mem = _storage(srv, "qm")

    # ---------------------------------------------------------- persist
    t0 = time.monotonic()
    resp = srv.client.persist(DB, "qm", timeout_s=1800)
    persist_s = time.monotonic() - t0
    persisted = sum(int(p["rows"]) for p in resp.get("persisted", []))
    files = [f for p in resp.get("persisted", []) for f in p.get("files", [])]
    store_dir = os.path.join(srv.data_dir, "objects", "bench_baseline")
    os.makedirs(store_dir, exist_ok=True)
    t0 = time.monotonic()
    pq.write_table(data, os.path.join(store_dir, "qm.parquet"))
    pa_s = time.monotonic() - t0
    laps.lap("persist")
    rp = Row("persist throughput (memory -> committed Parquet)", "points/s", persisted / persist_s,
             "pyarrow.parquet.write_table, same rows, same store", n / pa_s, target=">= 0.5x baseline", size=size,
             note=f"{persisted:,} rows in {persist_s:.2f} s ({len(files)} file(s)); pyarrow {pa_s:.2f} s")
    rp.met = rp.ratio is not None and rp.ratio >= 0.5
    rows.append(rp)

    states_pers = _storage(srv, "qm")
    q_pers, _, ok_pers, w_pers = _query(srv, "qm", s["query_repeat"], s["settle_quiet_s"], expect)
    laps.lap("query_persisted")
    rows += _flight_rows(srv, s["query_repeat"], min(n, FLIGHT_SCAN_ROWS), q_pers, expect, size)
    laps.lap("flight")

    # ---------------------------------------------------------- mixed
    half = len(lp) // 2
    lpx = [b.replace(b"qm,", b"qx,") for b in lp]
    _write(srv, s["clients"], lpx[:half])
    srv.client.persist(DB, "qx", timeout_s=1800)
    _write(srv, s["clients"], lpx[half:])
    q_mix, _, ok_mix, w_mix = _query(srv, "qx", s["query_repeat"], s["settle_quiet_s"], expect)
    laps.lap("mixed")
    states_mix = _storage(srv, "qx")

    base_median = statistics.median(base_q) if base_q else None
    base_times = [round(t, 4) for t in base_q] if base_q else None
    for label, v, ok, w, note in (("all in memory", q_mem, ok_mem, w_mem, f"chunks after the queries: {states_mem} (a "
                                   "queried table's write-buffer chunks move to the read buffer 2 s after their last "
                                   "write)"),
                                  ("all persisted", q_pers, ok_pers, w_pers, f"chunks after the queries: {states_pers}"),
                                  ("mixed", q_mix, ok_mix, w_mix, f"half persisted, half in memory; chunks after the "
                                   f"queries: {states_mix}")):
        settled = (f"settled {w['settle_s']:.1f} s after the warm-up" if w["settled"] else
                   f"NOT settled within {_SETTLE_TIMEOUT_S:.0f} s")
        r = Row(f"query latency, grouped aggregate, {label}", "s", statistics.median(v), "Spark SQL over plain Parquet",
                base_median, target="<= 1.2x baseline", better="lower", size=size,
                note=f"median of {s['query_repeat']} on the settled table (first query {w['first_query_s']:.2f} s, "
                     f"{settled}); {nrows} groups, exact count and sum per host: {ok}; {note}",
                extra={"times_s": [round(t, 4) for t in v],
                       "baseline_times_s": base_times, **w})
        r.met = r.ratio is not None and r.ratio <= 1.2 and ok
        rows.append(r)
    return rows


#: rows of the raw scan read over Flight and over our gRPC Query
FLIGHT_SCAN_ROWS = 1_000_000


def _flight_rows(srv, repeat: int, scan_rows: int, query_times: list, expect: dict, size: str) -> list[Row]:
    """Arrow Flight DoGet (InfluxDB 3's ticket) against our gRPC Query, on the settled, persisted
    table: the grouped aggregate (beside the Query runs just made) and a raw scan of `scan_rows` rows,
    medians of `repeat`; a report, no target."""
    import json

    import pyarrow.flight as fl

    def do_get(sql: str):
        ticket = fl.Ticket(json.dumps({"database": DB, "sql_query": sql, "query_type": "sql"}).encode())
        with fl.FlightClient(f"grpc+tcp://{srv.addr}") as f:
            return f.do_get(ticket).read_all()

    agg = SQL.format(t="qm")
    times, exact = [], True
    for _ in range(repeat):
        t0 = time.monotonic()
        t = do_get(agg)
        times.append(time.monotonic() - t0)
        exact = exact and {r["host"]: (r["n"], r["r"]) for r in t.to_pylist()} == expect
    scan = f"SELECT time, host, usage_user, requests FROM qm LIMIT {scan_rows}"
    f_scan, q_scan, counts = [], [], set()
    for _ in range(repeat):
        t0 = time.monotonic()
        counts.add(do_get(scan).num_rows)
        f_scan.append(time.monotonic() - t0)
        t0 = time.monotonic()
        counts.add(srv.client.query(DB, scan, timeout_s=600).num_rows)
        q_scan.append(time.monotonic() - t0)
    out = []
    for name, ours, base, ok, note in (
            ("query latency over Flight DoGet, grouped aggregate, all persisted", times, query_times, exact,
             "exact count and sum per host"),
            (f"query latency over Flight DoGet, raw scan of {scan_rows:,} rows", f_scan, q_scan,
             counts == {scan_rows}, f"every answer {scan_rows:,} rows")):
        r = Row(name, "s", statistics.median(ours), "our gRPC Query, same SQL", statistics.median(base),
                target="report", better="lower", size=size,
                note=f"median of {repeat}, InfluxDB 3's ticket through pyarrow.flight; {note}: {ok}",
                extra={"times_s": [round(t, 4) for t in ours], "baseline_times_s": [round(t, 4) for t in base]})
        r.met = ok
        out.append(r)
    return out


def _storage(srv, table: str) -> list:
    """["<state>/<storage>"] of the table's chunks now (sorted, distinct)."""
    return sorted({f"{c['state']}/{c.get('storage', '?')}" for p in status_partitions(srv.client.status(DB), DB)
                   if p["table"] == table for c in p["chunk_list"]})
