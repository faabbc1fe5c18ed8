"""Scenario 7: restart after SIGKILL with N unpersisted points.

Everything else the server holds is persisted first (`Persist` per database),
then N points are written (acknowledged) to a fresh database and the server's
process group (driver, JVM, Python workers) is killed with SIGKILL. The embedded broker keeps running (its own session), a
new `iox serve` starts on the same data directory, and the figure is the time
from launching it until a query counts every acknowledged point (replay from
the preserved catalog's plan). Reported next to Spark's own start time
(SparkSession + a first job) measured in the baseline Spark application.
"""
from __future__ import annotations

import time

from bench.harness import (Laps, Row, lp_batches, recent_t0_ns, run_writers, status_partitions,
                       tables_on_distinct_partitions)

DB = "bench_restart"


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    c = srv.client
    laps = Laps("restart", ctx.timings)
    for db in c.status().get("databases", []):
        c.persist(db["name"], timeout_s=600)
    laps.lap("persist_all")
    n = s["restart_points"]
    tables = tables_on_distinct_partitions("rs", ctx.partitions)
    t0 = recent_t0_ns(7200)
    per = n // len(tables)
    groups = [lp_batches(t, per, seed=300 + j, t0_ns=t0 + j * 10**11) for j, t in enumerate(tables)]
    batches = [b for grp in zip(*groups) for b in grp]
    st = run_writers(srv.addr, DB, batches, s["clients"], 600, once=True)
    acked = st.points
    c.wait_applied(DB, st.token, timeout_s=300)
    status = c.status()
    unpersisted = {d["name"]: sum(p["unpersisted_rows"] for p in status_partitions(status, d["name"]))
                   for d in status.get("databases", [])}
    laps.lap("write")
    srv.kill9()
    laps.lap("kill")
    t_launch = time.monotonic()
    srv.start(extra_args=ctx.server_args_after_restart)
    t_ready = time.monotonic()
    laps.lap("server_start")
    counted = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            c = srv.client
            applied = c.applied(DB)
            if all(applied.get(int(p), -1) >= off for p, off in st.token.items()):
                counted = sum(c.query(DB, f"SELECT count(*) AS n FROM {t}").column("n")[0].as_py() for t in tables)
                if counted >= acked:
                    break
        except Exception:
            pass
        time.sleep(0.1)
    done = time.monotonic()
    laps.lap("replay")
    ours = done - t_launch
    spark_start = ctx.worker.ready["start_seconds"] if ctx.worker is not None else None
    r = Row("restart after SIGKILL until all acked writes queryable", "s", ours, "Spark's own start time",
            spark_start, target="every acknowledged write queryable, exactly once", better="lower",
            size=f"{acked:,} acknowledged unpersisted points" + ("" if n >= 2_000_000 else " (quick: not 2M)"),
            note=f"server ready after {t_ready - t_launch:.1f} s, replay done {done - t_ready:.1f} s later; "
                 f"counted {counted} of {acked}; unpersisted rows at kill {unpersisted}"
                 + (f"; baseline Spark {ctx.worker_start_note}" if ctx.worker_start_note else ""))
    r.met = counted == acked
    return [r]
