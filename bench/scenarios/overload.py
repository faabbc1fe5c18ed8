"""Scenario 8b: peak server RSS under an overload of 3x the sustainable rate.

Sustainable rate = the end-to-end figure of scenario 2 (else half the write
maximum). For `overload_s` seconds 3x that is offered while the RSS of the
server process tree is sampled every 250 ms: paced gRPC writers at up to 80% of
the maximum write rate of scenario 1, and, for the rest (the write path of one
server on this machine cannot take 3x what the machine ingests end to end),
direct producers writing the router's exact wire format (the same line
protocol parsed and encoded as the router does, new points every cycle) to the
database's topic, as further routers of a scale-out deployment would. What is
overloaded is the consumer: it must slow down (read limit, backpressure) and
apply everything later. The server runs with `--memory-limit-bytes` (sizes'
`overload_memory_limit`, default the driver memory plus OVERHEAD_BYTES: the JVM's
heap does not shrink once grown, so a limit below it refuses writes for good):
past its soft fraction micro-batches read less and the lifecycle persists and
unloads first, at it writes are refused (RESOURCE_EXHAUSTED) until back under.
Reported: peak RSS against the limit, the rates offered and acknowledged,
RESOURCE_EXHAUSTED answers, and whether the server stayed up and then applied
every acknowledged write (nothing dropped).
"""
from __future__ import annotations

import threading
import time

from bench.harness import (POINTS_PER_BATCH, Laps, Row, RssSampler, WriteStats, distinct_cycle, lp_batches, recent_t0_ns,
                       run_writers, tables_on_distinct_partitions)

DB = "bench_overload"
#: share of the measured maximum write rate the gRPC writers offer (the rest comes from direct producers)
GRPC_SHARE_OF_MAX = 0.8
#: time allowed to apply the overload's backlog afterwards
DRAIN_TIMEOUT_S = 900
#: the default memory limit is the driver memory plus this (Python driver, off-heap, workers, broker)
OVERHEAD_BYTES = 3 << 30


def memory_limit_bytes(sizes: dict) -> int:
    """The overload run's --memory-limit-bytes: sizes' `overload_memory_limit` (e.g. "8g"), else the
    driver memory plus OVERHEAD_BYTES."""
    from iox_spark.server.config import parse_memory_bytes

    given = sizes.get("overload_memory_limit")
    return parse_memory_bytes(str(given)) if given else parse_memory_bytes(sizes["driver_memory"]) + OVERHEAD_BYTES


def _with_limit(args: list, limit: int) -> list:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--memory-limit-bytes":
            skip = True
            continue
        if not a.startswith("--memory-limit-bytes="):
            out.append(a)
    return out + ["--memory-limit-bytes", str(limit)]


def _direct_producers(bootstrap: str, partitions: int, batches: list, rate: float, seconds: float,
                      threads: int = 2) -> WriteStats:
    """Produces `batches` (line protocol) as the router's messages at `rate` points/s, each cycle as new
    points; returns acknowledged points, requests and the highest acknowledged offsets (token)."""
    from confluent_kafka import Producer

    from iox_spark.catalog.schema import Column
    from iox_spark.server.write.line_protocol import parse_lines
    from iox_spark.server.write_buffer.wire_format import encode_write
    from iox_spark.server.write_buffer.producer import producer_conf
    from iox_spark.catalog.sharding import partition_for, topic_for

    topic = topic_for(DB)
    stats = WriteStats()
    producer = Producer(producer_conf(bootstrap, 10_000))
    stop = threading.Event()
    poller = threading.Thread(target=lambda: [producer.poll(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    poller.start()
    start = time.monotonic()
    end = start + seconds
    interval = POINTS_PER_BATCH * threads / rate

    def delivered(err, msg):
        with stats.lock:
            if err is None:
                stats.points += POINTS_PER_BATCH
                stats.requests += 1
                stats.token[msg.partition()] = max(stats.token.get(msg.partition(), -1), msg.offset())
            else:
                stats.errors[err.name()] = stats.errors.get(err.name(), 0) + 1

    def worker(k: int):
        mine = batches[k::threads]
        i, next_at = 0, start + interval * k / threads
        while time.monotonic() < end:
            wait_s = next_at - time.monotonic()  # read once: the clock moves between two reads
            if wait_s > 0:
                time.sleep(wait_s)
            next_at += interval
            body = distinct_cycle(mine[i % len(mine)], 2_000_000 + k * 100_000 + i // len(mine))
            i += 1
            for name, tb in parse_lines(body).tables.items():
                w = encode_write(name, [Column(c.name, c.role, c.type) for c in tb.columns], tb.data, tb.unique_keys)
                while True:
                    try:
                        producer.produce(topic, value=w.value, key=w.key, headers=w.headers,
                                         partition=partition_for(name, partitions), on_delivery=delivered)
                        break
                    except BufferError:
                        time.sleep(0.01)
            with stats.lock:
                stats.offered_points += POINTS_PER_BATCH

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(seconds + 60)
    producer.flush(30)
    stop.set()
    stats.seconds = time.monotonic() - start
    return stats


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    max_write = ctx.figures.get("max_write_rate", 200_000)
    sustainable = ctx.figures.get("e2e_rate") or max_write / 2
    offered = 3 * sustainable
    grpc_rate = min(offered, GRPC_SHARE_OF_MAX * max_write)
    direct_rate = offered - grpc_rate
    laps = Laps("overload", ctx.timings)
    limit = memory_limit_bytes(s)
    srv.stop()  # again with the memory limit (the last scenario: nothing after it needs the old rules)
    srv.start(extra_args=_with_limit(srv.extra_args, limit))
    laps.lap("restart with the memory limit")
    tables = tables_on_distinct_partitions("ov", ctx.partitions)
    t0 = recent_t0_ns()
    groups = [lp_batches(t, 8 * 5000, seed=600 + j, t0_ns=t0 + j * 10**11) for j, t in enumerate(tables)]
    batches = [b for grp in zip(*groups) for b in grp]
    tok = srv.client.write(DB, batches[0])  # creates the topic the direct producers write to
    srv.client.wait_applied(DB, tok, timeout_s=120)
    direct: list = []
    with RssSampler(srv.pid) as rs:
        th = None
        if direct_rate > 0:
            th = threading.Thread(target=lambda: direct.append(
                _direct_producers(srv.broker_bootstrap(), ctx.partitions, batches, direct_rate, s["overload_s"])), daemon=True)
            th.start()
        st = run_writers(srv.addr, DB, batches, s["clients"] * 2, s["overload_s"], rate_points_per_s=grpc_rate)
        if th is not None:
            th.join(s["overload_s"] + 120)
    laps.lap("load")
    dst = direct[0] if direct else WriteStats()
    token = dict(st.token)
    for p, off in dst.token.items():
        token[p] = max(token.get(p, -1), off)
    alive = srv.proc.poll() is None
    drained = False
    try:
        srv.client.wait_applied(DB, token, timeout_s=DRAIN_TIMEOUT_S)
        drained = True
    except Exception:
        pass
    drain_s = laps.lap("drain")
    secs = max(st.seconds, dst.seconds or 0)
    offered_rate = (st.offered_points + dst.offered_points) / secs if secs else 0
    acked_rate = (st.points + dst.points) / secs if secs else 0
    errors = dict(st.errors)
    for k, v in dst.errors.items():
        errors[f"direct {k}"] = v
    r = Row("peak server RSS under 3x sustainable rate", "bytes", float(rs.peak), target=f"server stays up, "
            f"every ack applied, RSS under --memory-limit-bytes {limit / 2**30:.1f} GiB", better="lower",
            size=f"{s['overload_s']} s offering {offered:,.0f} points/s (3 x {sustainable:,.0f}): gRPC writers "
                 f"{grpc_rate:,.0f} target ({st.rate:,.0f} acknowledged), direct producers of the router's wire "
                 f"format {direct_rate:,.0f} target ({dst.rate:,.0f} acknowledged)",
            note=f"peak {rs.peak / 2**30:.2f} GiB of a {limit / 2**30:.2f} GiB limit "
                 f"({100 * rs.peak / limit:.0f}%); offered {offered_rate:,.0f} points/s in all, acknowledged "
                 f"{acked_rate:,.0f}; errors {errors or 'none'}; alive {alive}; all acknowledged points applied "
                 f"{drained}" + (f" ({drain_s:.0f} s after the load)" if drained else f" (not within {DRAIN_TIMEOUT_S} s)")
                 + ("; offered less than 90% of 3x" if offered_rate < 0.9 * offered else ""))
    r.met = alive and drained and rs.peak <= limit
    return [r]

