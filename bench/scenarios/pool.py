"""Ingester pool: end-to-end throughput with 1, 2 and 3 ingesters, and the write path's cost of routing.

For each pool size N (1, 2, 3) the scenario starts one broker of its own (`iox broker`, in
memory), N `iox serve --pool-member` processes on it with one shared object-store directory, and
an assigner (server/pool/assigner.py, in this process) that spreads the database's 6 Kafka partitions
over them. Writers send the same fixed set of new points (`pool_points`, one table per Kafka
partition, 5,000-point batches), unpaced, spread evenly over the N members (each member takes
writes for every partition and routes them to Kafka; the partition's owner applies them). The
figure is the acknowledged points / (time from the first write until every owner applied its
partitions' last acknowledged offsets, i.e. they are queryable). The ratio is against the pool of
one. On a machine with fewer cores than members this shows the pool's overhead (N Spark drivers
share the cores), not scaling.

Scaling: with at least two usable cores, the same points are then written to one member pinned
to one core (its JVM and Python workers inherit the CPU affinity, as under `taskset -c 0`) and to
two members pinned to a core each; the row is the ratio of the two (aim: 1.7x). The broker, the
assigner and the writers are not pinned: with one member they have the other core to themselves,
with two they share the cores with the members, so the ratio is a lower bound of the members'
scaling on a host with cores to spare.

Routing cost: the writers' acknowledgement latency (p50 / p99) at each size. A member routes a
write for a partition it does not own exactly as one it owns (produce to the partition by the
table's hash; nothing is forwarded to the owner), so this compares the write path of one server
with that of a member of a pool whose other members compete for the same cores.

The processes are stopped after each size; nothing is persisted (the lifecycle's thresholds are
not reached).
"""
from __future__ import annotations

import os
import subprocess
import threading
import time

import itertools

from bench.harness import (IOX, POINTS_PER_BATCH, Row, ServerProcess, WriteStats, free_port, lp_batches, percentile,
                           recent_t0_ns, run_writers, tables_on_distinct_partitions)

PARTITIONS = 6
SIZES = (1, 2, 3)
#: members of the scaling comparison, each on a core of its own, against one member on one core
SCALING_MEMBERS = 2
#: the scaling the comparison aims at (of a linear SCALING_MEMBERS x)
SCALING_GOAL = 1.7


def _start_broker(data_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    os.makedirs(data_dir, exist_ok=True)
    log = open(os.path.join(data_dir, "broker.log"), "ab")
    proc = subprocess.Popen([IOX, "broker", "--port", str(port), "--storage", "memory", "--data-dir", data_dir],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + 60
    while True:
        try:
            AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=2)
            return proc, f"127.0.0.1:{port}"
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the bench's broker did not start; see {data_dir}/broker.log")
            time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _one_size(ctx, n: int, batches: list, points: int, cores: list | None = None) -> dict:
    """`cores`: member k runs on core `cores[k]` only (None: members run on any core)."""
    from iox_spark.server.pool.assigner import Assigner

    label = f"{n}" if cores is None else f"{n}_pinned"
    root = os.path.join(ctx.tmp, f"pool-{label}")
    broker, bootstrap = _start_broker(os.path.join(root, "broker"))
    servers = []
    assigner = None
    try:
        store = os.path.join(root, "objects")
        for k in range(n):
            s = ServerProcess(os.path.join(root, f"m{k}"), driver_memory=ctx.sizes["driver_memory"],
                              partitions=PARTITIONS, cpus=frozenset({cores[k]}) if cores else None)
            s.launch(["--kafka-bootstrap", bootstrap, "--pool-member", f"m{k}", "--object-store", store,
                      "--persist-row-threshold", "100000000", "--persist-age-threshold-s", "36000"]
                     + ctx.server_extra)
            servers.append(s)
        for s in servers:
            s.wait_ready()
        db = f"bench_pool_{label}"
        warm = [servers[0].client.write(db, b) for b in batches[:PARTITIONS]]  # one batch per table
        assigner = Assigner([s.addr for s in servers], os.path.join(root, "assigner.json"), interval_s=0.5)
        deadline = time.monotonic() + 120
        while True:
            assigner.run_once()
            owned = [set(d["owned_partitions"]) for s in servers for d in s.client.status(db)["databases"]]
            if sorted(kp for o in owned for kp in o) == list(range(PARTITIONS)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the assigner did not assign every partition to {n} member(s): {owned}")
            time.sleep(0.5)
        owners = {kp: s for s in servers for d in s.client.status(db)["databases"] for kp in d["owned_partitions"]}
        # the warm-up writes applied by their owners before the clock starts
        for tok in warm:
            for kp, off in tok.items():
                owners[kp].client.wait_applied(db, {kp: off}, timeout_s=120)
        measured = batches[PARTITIONS:]
        clients = ctx.sizes["clients"]
        per_member = [measured[k::n] for k in range(n)]
        stats = [WriteStats() for _ in range(n)]
        t0 = time.monotonic()
        threads = [threading.Thread(target=run_writers, args=(s.addr, db, per_member[k], max(1, clients // n),
                                                               3600.0), kwargs=dict(stats=stats[k], once=True))
                   for k, s in enumerate(servers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_acked = time.monotonic()
        token: dict = {}
        for st in stats:
            for kp, off in st.token.items():
                token[kp] = max(token.get(kp, -1), off)
        for kp, off in token.items():
            owners[kp].client.wait_applied(db, {kp: off}, timeout_s=ctx.sizes["sink_timeout_s"])
        t_applied = time.monotonic()
        lat = [x for st in stats for x in st.latencies_s]
        acked = sum(st.points for st in stats)
        errors = {k: v for st in stats for k, v in st.errors.items()}
        return {"points_per_s": acked / (t_applied - t0), "acked": acked,
                "offered": len(measured) * POINTS_PER_BATCH,
                "ack_seconds": t_acked - t0, "applied_seconds": t_applied - t0,
                "p50_ms": percentile(lat, 50) * 1e3 if lat else None, "p99_ms": percentile(lat, 99) * 1e3 if lat else None,
                "errors": errors, "start_seconds": [round(s.start_seconds or 0, 1) for s in servers]}
    finally:
        if assigner is not None:
            assigner.close()
        for s in servers:
            s.kill9()
        _stop(broker)


def run(ctx) -> list[Row]:
    points = ctx.sizes["pool_points"]
    tables = tables_on_distinct_partitions("pool", PARTITIONS)
    t0 = recent_t0_ns()
    per_table = points // len(tables)
    by_table = [lp_batches(t, per_table, seed=100 + i, t0_ns=t0) for i, t in enumerate(tables)]
    # round robin over the tables: every member's share writes every partition
    batches = [b for group in itertools.zip_longest(*by_table) for b in group if b is not None]
    results = {}
    for n in SIZES:
        results[n] = _one_size(ctx, n, batches, points)
        r = results[n]
        print(f"  pool of {n}: {r['points_per_s']:,.0f} points/s, ack p50 {r['p50_ms']:.1f} ms, "
              f"p99 {r['p99_ms']:.1f} ms, errors {r['errors']}", flush=True)
    pinned = {}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= SCALING_MEMBERS:
        for n in (1, SCALING_MEMBERS):
            pinned[n] = _one_size(ctx, n, batches, points, cores=cores[:n])
            r = pinned[n]
            print(f"  pool of {n} on {n} core(s): {r['points_per_s']:,.0f} points/s, errors {r['errors']}", flush=True)
    one = results[1]["points_per_s"]
    size = f"{points:,} points, {PARTITIONS} Kafka partitions, {ctx.sizes['clients']} writers"
    rows = []
    for n in SIZES:
        r = results[n]
        rows.append(Row(f"pool end-to-end, {n} ingester{'s' if n > 1 else ''}", "points/s", r["points_per_s"],
                        baseline_name="pool of 1" if n > 1 else None, baseline=one if n > 1 else None,
                        target="report", met=not r["errors"] and r["acked"] == r["offered"],
                        size=size, extra=r,
                        note="overhead on this machine (members share its cores), not scaling" if n > 1 else ""))
    if pinned:
        n = SCALING_MEMBERS
        p1, pn = pinned[1], pinned[n]
        rows.append(Row(f"pool scaling, {n} members on {n} cores (one each)", "points/s", pn["points_per_s"],
                        baseline_name="1 member on 1 core", baseline=p1["points_per_s"], target=f">= {SCALING_GOAL}x baseline",
                        met=(not pn["errors"] and pn["acked"] == pn["offered"]
                             and pn["points_per_s"] >= SCALING_GOAL * p1["points_per_s"]),
                        size=size, extra={"one": p1, "many": pn},
                        note=("each member pinned to a core of its own (CPU affinity, as taskset -c); the broker and "
                              f"the writers run on any core; {PARTITIONS} tables, one per Kafka partition (a table "
                              "is not spread over partitions)")))
    rows.append(Row("pool write ack p99 (routing)", "ms", results[3]["p99_ms"], baseline_name="pool of 1",
                    baseline=results[1]["p99_ms"], target="report", met=True, size=size, better="lower",
                    note=f"p50 {results[3]['p50_ms']:.1f} ms vs {results[1]['p50_ms']:.1f} ms; every member routes "
                         "by the table's hash, nothing is forwarded"))
    return rows

