"""Scenario 1: write throughput, points/s acknowledged, through gRPC.

Ours: `clients` threads, each with its own gRPC channel, send line-protocol
batches of 5,000 points (one table per request, one table per Kafka
partition) for a bounded time; a point counts once its request is acknowledged
(after Kafka acked it). Baseline: confluent-kafka producing the same request
bytes straight to the same broker, with the server's producer configuration
(idempotent, acks=all, concurrent messages of a partition batched) and the same number of
concurrent requests in flight — the write buffer's limit. The baseline runs
after our server applied everything our run wrote (so it does not share the
machine with our backlog); then the run's points are persisted (not measured),
so the next scenario starts on an idle server.
"""
from __future__ import annotations

from bench.harness import (POINTS_PER_BATCH, Laps, Row, lp_batches, raw_produce, recent_t0_ns, run_writers,
                           tables_on_distinct_partitions)

DB = "bench_write"


def run(ctx) -> list[Row]:
    s = ctx.sizes
    laps = Laps("write", ctx.timings)
    tables = tables_on_distinct_partitions("wt", ctx.partitions)
    t0 = recent_t0_ns()
    batches = []
    per_table = s["write_batches_per_table"]
    for j, tbl in enumerate(tables):
        batches += lp_batches(tbl, per_table * POINTS_PER_BATCH, seed=100 + j, t0_ns=t0 + j * 10**11)
    # interleave so every client writes every table
    batches = [b for grp in zip(*[batches[j * per_table:(j + 1) * per_table] for j in range(len(tables))])
               for b in grp]
    # warm-up request (topic creation, schema)
    ctx.server.client.write(DB, batches[0])
    laps.lap("warmup")
    st = run_writers(ctx.server.addr, DB, batches, s["clients"], s["write_s"])
    laps.lap("ours")
    ctx.server.client.wait_applied(DB, st.token, timeout_s=900)
    drain_s = laps.lap("drain")
    base = raw_produce(ctx.server.broker_bootstrap(), batches, s["clients"], s["write_s"], ctx.partitions).rate
    laps.lap("baseline")
    # not measured: the next scenarios start on a server with nothing of this one left to do (no
    # read-buffer moves of these points while they measure; memory relief may unload them)
    ctx.server.client.persist(DB, timeout_s=1800)
    laps.lap("persist")
    ctx.figures["max_write_rate"] = st.rate
    r = Row("write throughput (gRPC, 5k-point LP batches)", "points/s", st.rate,
            "confluent-kafka produce of the same bytes", base, target=None,
            size=f"{s['clients']} clients x {s['write_s']} s, {len(tables)} tables on {ctx.partitions} Kafka partitions",
            note=(f"errors {st.errors}; " if st.errors else "") + "no target in the issue (ratio = share of the "
                 f"write buffer's limit); our run's points were applied {drain_s:.1f} s after it ended, then the "
                 "baseline ran")
    r.met = not st.errors and st.points > 0
    r.target = "report (no errors)"
    return [r]
