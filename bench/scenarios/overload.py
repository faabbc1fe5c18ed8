"""Scenario 8b: peak server RSS under an overload of 3x the sustainable rate.

Sustainable rate = the end-to-end figure of scenario 2 (else half the write
maximum). Paced writers offer 3x that for `overload_s` seconds while the RSS of
the server process tree is sampled every 250 ms. Reported: peak RSS, the rate
the clients actually managed to offer and get acknowledged, RESOURCE_EXHAUSTED
answers, and whether the server stayed up and then applied every acknowledged
write (nothing dropped).
"""
from __future__ import annotations

from ..harness import Laps, Row, RssSampler, lp_batches, recent_t0_ns, run_writers, tables_on_distinct_partitions

DB = "bench_overload"


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    sustainable = ctx.figures.get("e2e_rate") or ctx.figures.get("max_write_rate", 100_000) / 2
    offered = 3 * sustainable
    laps = Laps("overload", ctx.timings)
    tables = tables_on_distinct_partitions("ov", ctx.partitions)
    t0 = recent_t0_ns()
    groups = [lp_batches(t, 8 * 5000, seed=600 + j, t0_ns=t0 + j * 10**11) for j, t in enumerate(tables)]
    batches = [b for grp in zip(*groups) for b in grp]
    with RssSampler(srv.pid) as rs:
        st = run_writers(srv.addr, DB, batches, s["clients"] * 2, s["overload_s"], rate_points_per_s=offered)
    laps.lap("load")
    alive = srv.proc.poll() is None
    drained = False
    try:
        srv.client.wait_applied(DB, st.token, timeout_s=300)
        drained = True
    except Exception:
        pass
    laps.lap("drain")
    r = Row("peak server RSS under 3x sustainable rate", "bytes", float(rs.peak), target="server stays up, "
            "every ack applied", better="lower",
            size=f"{s['overload_s']} s offering {offered:,.0f} points/s (3 x {sustainable:,.0f}); "
                 f"acknowledged {st.rate:,.0f} points/s",
            note=f"peak {rs.peak / 2**30:.2f} GiB; errors {st.errors or 'none'}; alive {alive}; all acked applied "
                 f"{drained}" + ("; clients could not offer 3x on this machine" if st.offered_points / st.seconds
                                 < 0.9 * offered else ""))
    r.met = alive and drained
    return [r]
