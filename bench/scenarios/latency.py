"""Scenarios 3 and 4: write acknowledgement latency and visibility latency.

Load: paced writers at half of the maximum write rate measured by scenario 1
(5,000-point batches, open loop). Ack latency = request round trip of those
batches (p50/p99). Visibility: meanwhile a probe writes one uniquely tagged
point every `probe_interval_s`; from its acknowledgement the probe polls the
applied watermark and then runs a real SQL query until the query sees the
point. Visibility latency = acknowledgement -> first query result containing
the point (includes one query's own latency).
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

    def probe():
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
            t_ack = time.monotonic()
            seen = None
            while time.monotonic() - t_ack < 30:
                ap = pc.applied(DB)
                if all(ap.get(int(p), -1) >= off for p, off in t.items()):
                    n = pc.query(DB, f"SELECT count(*) AS n FROM probe WHERE id = '{pid}'").column("n")[0].as_py()
                    if n == 1:
                        seen = time.monotonic()
                        break
                else:
                    time.sleep(0.01)
            if seen is None:
                misses[0] += 1
            else:
                vis.append(seen - t_ack)
            stop.wait(s["probe_interval_s"])
        pc.close()

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    st = run_writers(srv.addr, DB, batches, s["clients"], s["lat_s"], rate_points_per_s=half)
    laps.lap("load")
    stop.set()
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
