"""Scenarios 3 and 4: write acknowledgement latency and visibility latency.

Load: paced writers at half of the maximum write rate measured by scenario 1
(5,000-point batches, open loop). Ack latency = request round trip of those
batches (p50/p99). Visibility: meanwhile a probe writer writes one uniquely
tagged point every `probe_interval_s` (whether or not earlier probes are
visible yet), and a checker polls the applied watermark and runs a real SQL
query for the probes whose write tokens are applied until the query returns
them. Visibility latency = acknowledgement -> the end of the first query
result containing the point (includes one query's own latency); a probe not
seen within 30 s is a miss.
"""
from __future__ import annotations

import threading
import time

from ..harness import Laps, Row, lp_batches, percentile, recent_t0_ns, run_writers, tables_on_distinct_partitions

DB = "bench_latency"


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    max_rate = ctx.figures.get("max_write_rate")
    if not max_rate:
        raise RuntimeError("latency needs the write throughput scenario's maximum rate")
    half = max_rate / 2
    laps = Laps("latency", ctx.timings)
    tables = tables_on_distinct_partitions("lat", ctx.partitions)
    t0 = recent_t0_ns()
    groups = [lp_batches(t, 8 * 5000, seed=400 + j, t0_ns=t0 + j * 10**11) for j, t in enumerate(tables)]
    batches = [b for grp in zip(*groups) for b in grp]
    c = srv.client
    tok = c.write(DB, batches[0])
    tok = c.write(DB, f"probe,id=warm v=1i {time.time_ns()}\n")
    c.wait_applied(DB, tok, timeout_s=120)
    c.query(DB, "SELECT count(*) FROM probe WHERE id = 'warm'")

    laps.lap("warmup")
    vis = []
    misses = [0]
    stop = threading.Event()

    #: (probe id, token, monotonic ack time) written and not seen yet; probe_writer appends, probe_checker removes
    pending: list = []
    lock = threading.Lock()
    writing_done = threading.Event()

    def probe_writer():
        from server.client import IoxClient

        pc = IoxClient(srv.addr)
        k = 0
        while not stop.is_set():
            k += 1
            pid = f"p{k}"
            try:
                t = pc.write(DB, f"probe,id={pid} v={k}i {time.time_ns()}\n")
            except Exception:
                misses[0] += 1
                continue
            with lock:
                pending.append((pid, t, time.monotonic()))
            stop.wait(s["probe_interval_s"])
        pc.close()
        writing_done.set()

    def probe_checker():
        from server.client import IoxClient

        pc = IoxClient(srv.addr)
        while True:
            with lock:
                waiting = list(pending)
            if not waiting:
                if writing_done.is_set():
                    break
                time.sleep(0.01)
                continue
            ap = pc.applied(DB)
            ready = [w for w in waiting if all(ap.get(int(p), -1) >= off for p, off in w[1].items())]
            seen: set = set()
            if ready:
                ids = ", ".join(f"'{w[0]}'" for w in ready)
                seen = set(pc.query(DB, f"SELECT id FROM probe WHERE id IN ({ids})").column("id").to_pylist())
            now = time.monotonic()
            with lock:
                for w in waiting:
                    if w[0] in seen:
                        vis.append(now - w[2])
                        pending.remove(w)
                    elif now - w[2] > 30:
                        misses[0] += 1
                        pending.remove(w)
            if not ready:
                time.sleep(0.01)
        pc.close()

    probes = [threading.Thread(target=probe_writer, daemon=True), threading.Thread(target=probe_checker, daemon=True)]
    for th in probes:
        th.start()
    st = run_writers(srv.addr, DB, batches, s["clients"], s["lat_s"], rate_points_per_s=half)
    laps.lap("load")
    stop.set()
    for th in probes:
        th.join(60)
    laps.lap("probe_tail")
    # the half load may exceed the sustainable ingest rate: leave an idle server to the next scenario
    drained = True
    try:
        c.wait_applied(DB, st.token, timeout_s=600)
    except TimeoutError:
        drained = False
    laps.lap("drain")
    lat_ms = [x * 1000 for x in st.latencies_s]
    p50, p99 = percentile(lat_ms, 50), percentile(lat_ms, 99)
    size = f"{len(lat_ms)} requests at {half:,.0f} points/s target ({st.rate:,.0f} achieved) for {s['lat_s']} s"
    rows = [Row("write ack latency p50 (half load)", "ms", p50, target=None, better="lower", size=size,
                note="no target for p50"),
            Row("write ack latency p99 (half load)", "ms", p99, target="<= 20 ms", better="lower", size=size,
                note=(f"errors {st.errors}; " if st.errors else "") + (
                    "" if drained else "the load's writes were not all applied within 600 s after it"))]
    rows[0].met = p50 is not None and p50 <= 20
    rows[0].target = "report"
    rows[1].met = p99 is not None and p99 <= 20
    vsize = f"{len(vis)} probes under the half load" + (f", {misses[0]} not seen within 30 s" if misses[0] else "")
    v50, v99 = percentile(vis, 50), percentile(vis, 99)
    rows.append(Row("visibility latency p50 (ack -> query sees it)", "s", v50, target="report", better="lower",
                    size=vsize, met=v50 is not None))
    rows.append(Row("visibility latency p99 (ack -> query sees it)", "s", v99, target="<= 2 s", better="lower",
                    size=vsize, met=v99 is not None and v99 <= 2 and not misses[0],
                    note="few samples: p99 ~ max" if len(vis) < 100 else ""))
    return rows
