"""Scenarios 3 and 4: write acknowledgement latency and visibility latency.

Ack latency: paced writers at half of the maximum write rate measured by
scenario 1 (5,000-point batches, open loop) for `lat_s`; the figure is the
request round trip of those batches (p50/p99). The writers and the probes run
at real-time priority during both loads (harness.RealtimeClients): they stand in
for clients on machines of their own, which do not wait for a core behind the
server's Spark JVM as a client on this shared machine would.

Visibility: a probe writer writes one uniquely tagged point every
`probe_interval_s` (whether or not earlier probes are visible yet), and a
checker polls the visible watermark (applied, plus what the write buffer's
tail holds: server/query/tail.py) and runs a real SQL query for the
probes whose write tokens are visible until the query returns them. Visibility
latency = acknowledgement -> the end of the first query result containing the
point (includes one query's own latency); a probe not seen within 30 s is a
miss. Half the maximum WRITE rate may be more than the server ingests
end to end (then the lag, and with it visibility, grows for as long as the load
lasts: a figure of the run's length, not of the server), so the figure is
measured in a second load of `lat_s` at half the sustained end-to-end rate
(scenario 2's figure; without it, at the ack load); the probes under the ack
load are reported in its note.
"""
from __future__ import annotations

import threading
import time

from bench.harness import (Laps, RealtimeClients, Row, lp_batches, percentile, raw_produce, recent_t0_ns,
                           run_writers, stage_percentiles_ms, tables_on_distinct_partitions, write_stage_buckets)

DB = "bench_latency"


class _Probes:
    """The visibility probes (see the module docstring) in two threads, from `start` until `stop`."""

    def __init__(self, srv, probe_interval_s: float, prefix: str):
        self.srv, self.interval_s, self.prefix = srv, probe_interval_s, prefix
        self.vis: list = []
        #: per seen probe: ack -> first seen in the visible watermark (s), and that query's own duration (s)
        self.to_watermark: list = []
        self.query_s: list = []
        self.misses = 0
        self._stop = threading.Event()
        #: (probe id, token, monotonic ack time) written and not seen yet; the writer appends, the checker removes
        self._pending: list = []
        self._lock = threading.Lock()
        self._writing_done = threading.Event()
        self._threads = [threading.Thread(target=self._writer, daemon=True),
                         threading.Thread(target=self._checker, daemon=True)]

    def start(self) -> "_Probes":
        for th in self._threads:
            th.start()
        return self

    def stop(self) -> "_Probes":
        self._stop.set()
        for th in self._threads:
            th.join(60)
        return self

    def _writer(self):
        from iox_spark.server.api.client import IoxClient

        pc = IoxClient(self.srv.addr)
        k = 0
        while not self._stop.is_set():
            k += 1
            pid = f"{self.prefix}{k}"
            try:
                t = pc.write(DB, f"probe,id={pid} v={k}i {time.time_ns()}\n")
            except Exception:
                self.misses += 1
                continue
            with self._lock:
                self._pending.append((pid, t, time.monotonic()))
            self._stop.wait(self.interval_s)
        pc.close()
        self._writing_done.set()

    def _checker(self):
        from iox_spark.server.api.client import IoxClient

        pc = IoxClient(self.srv.addr)
        while True:
            with self._lock:
                waiting = list(self._pending)
            if not waiting:
                if self._writing_done.is_set():
                    break
                time.sleep(0.01)
                continue
            ap = pc.visible(DB)
            t_ready = time.monotonic()
            ready = [w for w in waiting if all(ap.get(int(p), -1) >= off for p, off in w[1].items())]
            seen: set = set()
            if ready:
                ids = ", ".join(f"'{w[0]}'" for w in ready)
                seen = set(pc.query(DB, f"SELECT id FROM probe WHERE id IN ({ids})").column("id").to_pylist())
            now = time.monotonic()
            with self._lock:
                for w in waiting:
                    if w[0] in seen:
                        self.vis.append(now - w[2])
                        self.to_watermark.append(max(0.0, t_ready - w[2]))
                        self.query_s.append(now - t_ready)
                        self._pending.remove(w)
                    elif now - w[2] > 30:
                        self.misses += 1
                        self._pending.remove(w)
            if not ready:
                time.sleep(0.01)
        pc.close()

    def summary(self) -> str:
        p50, p99 = percentile(self.vis, 50), percentile(self.vis, 99)
        got = f"p50 {p50:.2f} s, p99 {p99:.2f} s" if p50 is not None else "no probe seen"
        return f"{got} over {len(self.vis)} probes" + (f", {self.misses} not seen within 30 s" if self.misses else "")

    def parts(self) -> str:
        """Where the time went: ack -> visible watermark (the write buffer's tail or Spark), and the query."""
        if not self.vis:
            return ""
        w50, w99 = percentile(self.to_watermark, 50), percentile(self.to_watermark, 99)
        q50, q99 = percentile(self.query_s, 50), percentile(self.query_s, 99)
        return (f"ack -> visible watermark p50 {w50:.2f} s / p99 {w99:.2f} s (includes waiting for the checker's "
                f"previous query), the query that saw it p50 {q50:.2f} s / p99 {q99:.2f} s")


def _load(srv, batches: list, s: dict, rate: float, cycle_base: int, prefix: str):
    """Writers paced at `rate` for lat_s with probes running, then the wait until the load is applied
    (so the next phase or scenario gets an idle server). The writers and probes run at real-time
    priority (`RealtimeClients`: clients on machines of their own). Returns (WriteStats, _Probes,
    drained, the server's stage percentiles of the load's requests: `stage_percentiles_ms`,
    whether the clients were at real-time priority)."""
    stages0 = write_stage_buckets(srv.http_port)
    with RealtimeClients() as rt:
        probes = _Probes(srv, s["probe_interval_s"], prefix).start()
        st = run_writers(srv.addr, DB, batches, s["clients"], s["lat_s"], rate_points_per_s=rate,
                         cycle_base=cycle_base)
        probes.stop()
    stages = stage_percentiles_ms(stages0, write_stage_buckets(srv.http_port))
    try:
        srv.client.wait_applied(DB, st.token, timeout_s=600)
        drained = True
    except TimeoutError:
        drained = False
    return st, probes, drained, stages, rt.raised


def _clients_note(realtime: bool) -> str:
    if realtime:
        return ("the writers ran at real-time priority (clients on machines of their own do not wait for a core "
                "behind the server's Spark)")
    return "the writers ran at the normal CPU policy (real-time refused), so their own wait for a core counts"


def _stages_note(stages: dict) -> str:
    """Where the server spent a request's time, from its stage histograms (bucket bounds)."""
    if not stages:
        return ""
    n = max(k for k, _ in stages.values())
    parts = [f"{name} p50 <= {b[0]:g} / p99 <= {b[1]:g} ms" for name, (_k, b) in stages.items()]
    return (f"server side per stage ({n} requests, the probes' included; GET /metrics bucket bounds): "
            + ", ".join(parts) + "; the rest of a round trip is gRPC and the client")


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

    st, ack_probes, drained, ack_stages, rt_clients = _load(srv, batches, s, half, cycle_base=1, prefix="a")
    laps.lap("ack_load")
    with RealtimeClients():
        raw = raw_produce(srv.broker_bootstrap(), batches, s["clients"], s["lat_s"], ctx.partitions,
                          rate_points_per_s=half)
    laps.lap("ack_baseline")
    e2e_rate = ctx.figures.get("e2e_rate")
    vis_rate = s.get("visibility_points_per_s") or (e2e_rate / 2 if e2e_rate else None)
    if vis_rate:
        vst, probes, vdrained, _stages, _rt = _load(srv, batches, s, vis_rate, cycle_base=1_000_000, prefix="v")
        laps.lap("visibility_load")
        what = "half the sustained end-to-end rate" if not s.get("visibility_points_per_s") else "set by --set"
        vload = f"{what}, {vis_rate:,.0f} points/s target ({vst.rate:,.0f} achieved)"
    else:
        probes, vdrained = ack_probes, drained
        vload = f"the ack load (no end-to-end figure in this run), {half:,.0f} points/s target"

    srv.client.persist(DB, timeout_s=1800)  # not measured: the next scenario starts on an idle server
    laps.lap("persist")

    lat_ms = [x * 1000 for x in st.latencies_s]
    p50, p99 = percentile(lat_ms, 50), percentile(lat_ms, 99)
    size = f"{len(lat_ms)} requests at {half:,.0f} points/s target ({st.rate:,.0f} achieved) for {s['lat_s']} s"
    raw_ms = [x * 1000 for x in raw.latencies_s]
    base_name = "confluent-kafka produce of the same bytes, same rate and concurrency"
    base_note = (f"baseline: {len(raw_ms)} messages ({raw.rate:,.0f} points/s achieved"
                 + (f", errors {raw.errors}" if raw.errors else "") + ") from one producer with the server's "
                 "configuration, right after our load was applied, the clients at the same priority")
    undrained = "the load's writes were not all applied within 600 s after it"
    rows = [Row("write ack latency p50 (half load)", "ms", p50, base_name, percentile(raw_ms, 50), target="report",
                better="lower", size=size, note="no target for p50; " + base_note, met=p50 is not None and p50 <= 20),
            Row("write ack latency p99 (half load)", "ms", p99, base_name, percentile(raw_ms, 99), target="<= 20 ms",
                better="lower", size=size,
                note="; ".join(x for x in (f"errors {st.errors}" if st.errors else "", "" if drained else undrained,
                                           _clients_note(rt_clients), _stages_note(ack_stages), base_note) if x),
                met=p99 is not None and p99 <= 20, extra={"server_stage_bounds_ms": ack_stages})]
    vsize = f"{len(probes.vis)} probes, one per {s['probe_interval_s']} s, under {vload} for {s['lat_s']} s" + \
        (f", {probes.misses} not seen within 30 s" if probes.misses else "")
    vnote = "; ".join(x for x in (
        probes.parts(),
        f"under the ack load ({half:,.0f} points/s target): {ack_probes.summary()}" if vis_rate else "",
        "" if vdrained else undrained) if x)
    v50, v99 = percentile(probes.vis, 50), percentile(probes.vis, 99)
    rows.append(Row("visibility latency p50 (ack -> query sees it)", "s", v50, target="report", better="lower",
                    size=vsize, met=v50 is not None, note=vnote))
    rows.append(Row("visibility latency p99 (ack -> query sees it)", "s", v99, target="<= 2 s", better="lower",
                    size=vsize, met=v99 is not None and v99 <= 2 and not probes.misses,
                    note=("few samples: p99 ~ max; " if len(probes.vis) < 100 else "") + vnote))
    return rows
