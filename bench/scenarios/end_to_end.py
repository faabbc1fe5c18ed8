"""Scenario 2 (end-to-end sustained ingest) and scenario 9 (Parquet files per table partition).

Ours: `clients` writers send 5,000-point batches of new points (one table per
Kafka partition) while a sampler records the lag (acknowledged minus applied
write-buffer offsets). First an unpaced burst of `e2e_s` / 2 seconds: what the
machine takes when writers do not wait (the write path then outruns the
consumer, so the lag grows by design). Then the sustained run: writers paced at
85% of the burst's rate for `e2e_s` seconds (at 70% again if the lag grew;
quick mode makes one try; every run adds to what the in-memory broker and the
server hold, so full mode stops at two). The
figure is the sustained run's acknowledged points / (time from its first write
until its last acknowledged offset is applied, i.e. queryable), and it counts as
met only if that run's lag did not grow. The server runs its lifecycle
(row-threshold persists with a short late-arrive window; a partition's files
compacted once it had no write for the mode's `e2e_cold_s`) during the runs, as in
steady state; after the burst, what is left unpersisted is persisted, the
lifecycle's compaction of the then cold partitions' files is waited for, and the
baseline runs with the machine to itself, before the sustained runs. A second
sustained run starts once the lifecycle is done with the first one's data (its
last persists, the compaction of its cold partitions' files): each run measures
the lifecycle work its own writes cause, not a previous run's.

Baseline: a plain Spark Structured Streaming job in a separate Spark
application (bench/spark_worker.py) reading the same messages on the same broker
with the same `iox_kafka` Python source, decoding the Arrow payloads and writing
Parquet with Spark's file sink (partitioned by table and day), with the same
per-partition read limit and trigger interval. It catches up on the messages
our topic held at the burst's end, produced again (same bodies, encoded as our
router encodes them, the write buffer's producer settings) to a topic of its
own, `bench.sink`, once the burst is persisted: our server deletes what it
persisted from the durable embedded broker's store (server/runtime/broker_truncation.py),
and the copy's partitions hold as many batches as ours did. It is warmed up
first: the same job on a tiny topic of the same wire format, `bench.warm`,
produced straight to the broker; it runs while our server is still starting or
warming up on its first micro-batches, neither warm-up is measured. So it has
the machine to itself and no write path to pay for: a conservative comparison.

Files: Parquet files per table partition after an hour-equivalent. The file
sink never merges files, so its count grows linearly: measured x 3600 / run
seconds. Ours compacts persisted files, so it is measured, not extrapolated:
one table partition gets as many forced persists as an hour at this run's rate
and IOx's 1M-row threshold would make (capped by the mode's `files_persists`),
and its files are counted once the lifecycle compacted the cold partition.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from bench.harness import (POINTS_PER_BATCH, Laps, Row, WriteStats, distinct_cycle, lp_batches, recent_t0_ns, run_writers, status_partitions,
                       tables_on_distinct_partitions)

DB = "bench_e2e"
#: the baseline's warm-up topic: not iox.*, so our server's consumer ignores it
WARM_TOPIC = "bench.warm"
#: the topic the baseline catches up on: the messages of our topic until the burst's end, produced again
#: (our server deletes what it persisted from the durable embedded broker's store)
SINK_TOPIC = "bench.sink"


def produce_as_router(bootstrap: str, topic: str, partitions: int, bodies: dict) -> dict:
    """Creates `topic` (`partitions` partitions) and produces {partition: [line-protocol body]} to it,
    each body encoded as our router encodes a write request (one message per table), with the
    write buffer's producer settings and a record batch per message; returns {"<partition>": end offset}."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from iox_spark.catalog.schema import Column
    from iox_spark.server.write.line_protocol import parse_lines
    from iox_spark.server.write_buffer.producer import producer_conf
    from iox_spark.server.write_buffer.wire_format import encode_write

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    except Exception:  # noqa: BLE001 - already exists
        pass
    # a record batch per message, as our topic holds them: the bench's writers have one request in
    # flight per partition, so the server's producer never shares a batch between two of them
    producer = Producer({**producer_conf(bootstrap, 60_000), "batch.num.messages": 1})
    ends: dict = {}
    errors: list = []

    def delivered(err, msg):
        if err is None:
            ends[str(msg.partition())] = max(ends.get(str(msg.partition()), 0), msg.offset() + 1)
        else:
            errors.append(err)

    for p, ps in sorted(bodies.items()):
        for body in ps:
            for name, tb in parse_lines(body).tables.items():
                w = encode_write(name, [Column(c.name, c.role, c.type) for c in tb.columns], tb.data)
                producer.produce(topic, value=w.value, key=w.key, headers=w.headers, partition=p,
                                 on_delivery=delivered)
                producer.poll(0)
    producer.flush(120)
    if errors or len(ends) != len([p for p, ps in bodies.items() if ps]):
        raise RuntimeError(f"topic {topic}: only partitions {sorted(ends)} acknowledged ({errors[:3]})")
    return ends


class BaselineWarmup:
    """The baseline file sink's warm-up (not measured), in a thread: the same job as the measured one
    on a tiny topic of our wire format (one 5,000-point message per partition, encoded as our router
    encodes a line-protocol request) produced straight to the broker.

    `__init__` produces the topic (the broker must be up, the server need not be); `start` runs the
    job once the baseline Spark application is up; `join` waits for it and raises its failure.
    """

    def __init__(self, ctx, bootstrap: str):
        self.ctx = ctx
        self.bootstrap = bootstrap
        self.error: Exception | None = None
        self.thread: threading.Thread | None = None
        t0 = recent_t0_ns()
        bodies = {p: [lp_batches(f"warm{p}", POINTS_PER_BATCH, seed=190 + p, t0_ns=t0 + p * 10**11)[0]]
                  for p in range(ctx.partitions)}
        self.end_offsets = {WARM_TOPIC: produce_as_router(bootstrap, WARM_TOPIC, ctx.partitions, bodies)}

    def start(self) -> None:
        scratch = os.path.join(self.ctx.tmp, "filesink")

        def run():
            try:
                self.ctx.worker.call("filesink", bootstrap=self.bootstrap, topic_prefix=WARM_TOPIC,
                                     out=os.path.join(scratch, "warm"), ckpt=os.path.join(scratch, "warm-ckpt"),
                                     end_offsets=self.end_offsets, max_per_partition=2000, trigger_ms=100,
                                     timeout_s=180, wait_s=240)
            except Exception as e:  # noqa: BLE001 - raised by join
                self.error = e

        self.thread = threading.Thread(target=run, name="baseline-warmup", daemon=True)
        self.thread.start()

    def join(self, timeout_s: float = 300.0) -> None:
        if self.thread is None:
            self.start()
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise RuntimeError(f"baseline warm-up did not finish within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"baseline warm-up failed: {self.error}")


def _lag_points(token: dict, applied: dict) -> int:
    return sum(max(0, off - applied.get(p, -1)) for p, off in token.items()) * POINTS_PER_BATCH


@dataclass
class _Run:
    """One measured write run: acknowledged points, when the writes ended and when all were applied."""
    offered_rate: float | None
    stats: WriteStats
    start: float
    writes_done: float
    applied_at: float
    samples: list

    @property
    def rate(self) -> float:
        """Points per second from the first write until every acknowledged point was queryable."""
        return self.stats.points / (self.applied_at - self.start)

    @property
    def drain_s(self) -> float:
        return self.applied_at - self.writes_done

    def lag(self) -> tuple[float, float, bool]:
        """(mean lag of the middle third, of the last third, growing: last > 1.2 x middle + slack)."""
        in_run = [lag for t, lag in self.samples if t <= self.writes_done - self.start]
        n = len(in_run)
        mid, last = in_run[n // 3: 2 * n // 3], in_run[2 * n // 3:]
        mid_avg = sum(mid) / len(mid) if mid else 0
        last_avg = sum(last) / len(last) if last else 0
        return mid_avg, last_avg, last_avg > 1.2 * mid_avg + 2 * POINTS_PER_BATCH * len(self.stats.token or {0: 0})


def _measured_run(srv, batches: list, clients: int, seconds: float, rate: float | None, cycle_base: int) -> _Run:
    """Writers for `seconds` (paced at `rate` points/s, or unpaced), the lag sampled every 0.5 s, then
    the wait until every acknowledged offset is applied."""
    stats = WriteStats()
    samples = []
    stop = threading.Event()
    start = time.monotonic()

    def sampler():
        c = srv.client
        while not stop.wait(0.5):
            try:
                samples.append((time.monotonic() - start, _lag_points(stats.token_now(), c.applied(DB))))
            except Exception:
                pass

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    run_writers(srv.addr, DB, batches, clients, seconds, rate_points_per_s=rate, stats=stats, cycle_base=cycle_base)
    writes_done = time.monotonic()
    srv.client.wait_applied(DB, stats.token, timeout_s=900)
    applied_at = time.monotonic()
    stop.set()
    th.join(2)
    return _Run(rate, stats, start, writes_done, applied_at, samples)


def _kept_samples(r: _Run) -> list:
    """A run's lag samples as the JSON keeps them: [seconds, points], the last 200."""
    return [(round(t, 2), lag) for t, lag in r.samples][-200:]


def _attempt(frac: float, r: _Run) -> dict:
    """One paced run as the JSON keeps it: a run whose lag grew is kept with its lag, for diagnosis."""
    mid_avg, last_avg, growing = r.lag()
    return {"fraction": frac, "offered": r.offered_rate, "rate": r.rate, "growing": growing,
            "lag_mid_avg": mid_avg, "lag_last_avg": last_avg, "drain_s": round(r.drain_s, 2),
            "lag_samples": _kept_samples(r)}


#: paced runs at these fractions of the burst's rate, until one does not grow its lag (the
#: mode's `e2e_paced_tries` first ones)
_PACED_FRACTIONS = (0.85, 0.7)


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    laps = Laps("e2e", ctx.timings)
    tables = tables_on_distinct_partitions("e2e", ctx.partitions)
    t0 = recent_t0_ns()
    per_table = s["e2e_batches_per_table"]
    # warm-up, not measured: our topic's first batch (topic, schema, first micro-batches); meanwhile the
    # baseline's warm-up finishes (main started it with the baseline Spark application, else start it now)
    if ctx.worker is not None and ctx.baseline_warmup is None:
        ctx.baseline_warmup = BaselineWarmup(ctx, srv.broker_bootstrap())
        ctx.baseline_warmup.start()
    groups = [lp_batches(tbl, per_table * POINTS_PER_BATCH, seed=200 + j, t0_ns=t0 + j * 10**11)
              for j, tbl in enumerate(tables)]
    batches = [b for grp in zip(*groups) for b in grp]
    tok = srv.client.write(DB, batches[0])
    srv.client.wait_applied(DB, tok, timeout_s=120)
    base_token = dict(tok)
    laps.lap("warmup")
    if ctx.baseline_warmup is not None:
        ctx.baseline_warmup.join()
        laps.lap("baseline_warmup_wait")

    # 1. an unpaced burst: what the machine takes when writers do not wait (capacity, drain included)
    burst = _measured_run(srv, batches, s["clients"], max(2.0, s["e2e_s"] / 2), None, cycle_base=1)
    laps.lap("burst")
    # after the burst the lifecycle settles: it persists (by row threshold) until no partition holds a
    # threshold's worth of unpersisted rows; wait for that (at most settle_s), then count the files
    threshold = s["e2e_persist_row_threshold"]
    parts, settled = _poll_partitions(srv, tables, lambda ps: all(p["unpersisted_rows"] < threshold for p in ps),
                                      s["settle_s"])
    ours_files = max((p["files"] for p in parts), default=0)
    settle_took = laps.lap("settle")
    # what is left in memory is persisted now, and the lifecycle's compaction of the cold partitions'
    # files is waited for, so our server does nothing (no move to the read buffer, no persist, no
    # compaction) while the baseline's catch-up is measured; the baseline reads a copy of what our
    # topic held (the warm-up batch and the burst)
    srv.client.persist(DB, timeout_s=600)
    laps.lap("persist_rest")
    _, quiet = _poll_partitions(srv, tables, _lifecycle_done, s["settle_s"])
    laps.lap("compaction_wait")

    # -------- baseline: plain Spark file sink over the same messages: the warm-up batch and the burst
    base = None
    sink = None
    note_b = ""
    if ctx.worker is not None:
        boot = srv.broker_bootstrap()
        scratch = os.path.join(ctx.tmp, "filesink")
        # as many messages of each partition's table as our topic held at the burst's end, the same
        # bodies in the same cycles (tables[p] is on partition p)
        copies = {int(p): [distinct_cycle(groups[int(p)][i % len(groups[int(p)])], 1 + i // len(groups[int(p)]))
                           for i in range(o + 1)] for p, o in burst.stats.token.items()}
        end = produce_as_router(boot, SINK_TOPIC, ctx.partitions, copies)
        laps.lap("baseline_copy")
        sink = ctx.worker.call("filesink", bootstrap=boot, topic_prefix=SINK_TOPIC,
                               out=os.path.join(scratch, "out"), ckpt=os.path.join(scratch, "ckpt"),
                               end_offsets={SINK_TOPIC: end}, max_per_partition=2000, trigger_ms=100,
                               timeout_s=s["sink_timeout_s"], wait_s=s["sink_timeout_s"] + 60)
        laps.lap("baseline_sink")
        if sink.get("seconds"):
            base = sink["rows"] / sink["seconds"]
            note_b = (f"baseline caught up {sink['rows']:,} rows (the burst's messages) in "
                      f"{sink['seconds']:.1f} s, {sink['batches']} micro-batches"
                      + ("" if quiet else f" (our lifecycle was still busy after {s['settle_s']:.0f} s of waiting)"))
        else:
            note_b = "baseline did not finish within its time limit"
    # 2. sustained: writers paced below the burst's rate for e2e_s; the lag must not grow
    attempts = []
    for k, frac in enumerate(_PACED_FRACTIONS[:s["e2e_paced_tries"]]):
        if k:  # the previous run's last persists and the compaction of its cold partitions' files
            _, quiet = _poll_partitions(srv, tables, lambda ps: _lifecycle_done(ps, threshold), s["settle_s"])
            laps.lap(f"lifecycle_wait_{frac}")
            if not quiet:
                note_b += f"; the lifecycle was still busy {s['settle_s']:.0f} s after the run at {attempts[-1][0]:.0%}"
        r = _measured_run(srv, batches, s["clients"], s["e2e_s"], frac * burst.rate, cycle_base=(k + 1) * 100_000)
        attempts.append((frac, r))
        laps.lap(f"paced_{frac}")
        if not r.lag()[2]:
            break
    steady = [(f, r) for f, r in attempts if not r.lag()[2]]
    frac, best = max(steady, key=lambda fr: fr[1].rate) if steady else attempts[-1]
    ours = best.rate
    mid_avg, last_avg, growing = best.lag()
    ctx.figures["e2e_rate"] = ours

    stats = best.stats
    run_s = best.writes_done - best.start
    total_msgs = sum(o + 1 for o in stats.token.values())
    tried = "; ".join(f"paced at {f:.0%} of the burst ({r.offered_rate:,.0f} offered): {r.rate:,.0f} points/s, "
                      f"lag {'GROWING' if r.lag()[2] else 'not growing'}" for f, r in attempts)
    rows = []
    r = Row("end-to-end sustained ingest (write -> queryable)", "points/s", ours,
            "Spark Structured Streaming, same source, Parquet file sink", base,
            target=">= 500k points/s and >= 1.0x baseline",
            size=f"{stats.points:,} points in {run_s:.0f} s by {s['clients']} clients paced at {frac:.0%} of the "
                 f"unpaced burst" + ("" if s["e2e_s"] >= 60 else " (quick: < 60 s)"),
            note=f"lag {'GROWING' if growing else 'not growing'} (mid-run avg {mid_avg:,.0f}, last third "
                 f"{last_avg:,.0f} points), drained {best.drain_s:.1f} s after writes stopped; burst (unpaced, "
                 f"{burst.stats.points:,} points in {burst.writes_done - burst.start:.0f} s): {burst.rate:,.0f} "
                 f"points/s until all queryable, drained {burst.drain_s:.1f} s after; {tried}; " + note_b,
            extra={"lag_samples": _kept_samples(best), "messages": total_msgs,
                   "base_token": base_token, "errors": stats.errors, "burst_rate": burst.rate,
                   "attempts": [_attempt(f, rr) for f, rr in attempts]})
    r.met = ours >= 500_000 and r.ratio is not None and r.ratio >= 1.0 and not growing
    rows.append(r)

    sink_files = max(sink["files"].values()) if sink and sink.get("files") else None
    # the sink never merges its files: they grow linearly, so its hour is measured x (an hour of input at
    # our sustained rate / its input)
    sink_factor = 3600.0 * ours / sink["rows"] if sink and sink.get("rows") else None
    # ours: an hour at this run's rate persists each partition ~ hour_persists times (rows / the 1M
    # default threshold); that many persists of one table partition are made, with the server's
    # lifecycle compacting the files meanwhile, then counted once it settled
    per_partition_rate = ours / max(1, len(tables))
    hour_persists = max(1, round(per_partition_rate * 3600 / 1_000_000))
    n_persists = min(hour_persists, s["files_persists"])
    hour = _persists_then_compaction(srv, n_persists, s["settle_s"])
    laps.lap("files_hour")
    rf = Row("Parquet files per table partition (hour-equivalent)", "files", hour["files_after"],
             "Spark file sink", sink_files * sink_factor if sink_files is not None and sink_factor else None,
             target="<= 2 per table partition", better="lower",
             size=f"ours: {n_persists} persists of one table partition (an hour at this run's rate and the 1M "
                  f"threshold is {hour_persists}), counted after the lifecycle's compaction; sink {sink_files} for "
                  f"{(sink or {}).get('rows', 0):,} rows, x {sink_factor or 0:.0f} to an hour of the same input",
             note=f"ours: at most {hour['files_peak']} files at any time during the persists "
                  f"(compaction at the default 10-file threshold), {hour['files_after']} after the partition went cold "
                  f"({hour['settle_s']:.1f} s after the last persist; {hour['rows']:,} rows, exact: "
                  f"{hour['rows_ok']}); the e2e run's partitions held {ours_files} file(s) {settle_took:.1f} s after "
                  "its drain; "
                  "sink: catch-up batches (a live sink at a 100 ms trigger writes a file per partition per batch, "
                  "far more)")
    rf.met = rf.ours <= 2 and hour["rows_ok"]
    rows.append(rf)
    return rows


def _persists_then_compaction(srv, n_persists: int, settle_s: float) -> dict:
    """`n_persists` forced persists of one table partition (5,000 points written before each); the
    peak file count seen, and the count once the lifecycle compacted the cold partition (within
    `settle_s`). Checks that every row is still there exactly once."""
    table = "e2e_files"
    t0 = recent_t0_ns(1800)
    peak = 0
    for k in range(n_persists):
        tok = srv.client.write(DB, lp_batches(table, POINTS_PER_BATCH, seed=900 + k,
                                              t0_ns=t0 + k * POINTS_PER_BATCH * 1_000)[0])
        srv.client.wait_applied(DB, tok, timeout_s=120)
        srv.client.persist(DB, table, timeout_s=600)
        files = [p["files"] for p in status_partitions(srv.client.status(DB), DB) if p["table"] == table]
        peak = max([peak] + files)
    done = time.monotonic()
    parts, _ = _poll_partitions(srv, [table], lambda ps: max(p["files"] for p in ps) <= 1, settle_s)
    after = max(p["files"] for p in parts)
    n = srv.client.query(DB, f"SELECT count(*) AS n, count(DISTINCT time_ns) AS d FROM {table}").to_pylist()[0]
    want = n_persists * POINTS_PER_BATCH
    return {"files_peak": peak, "files_after": after, "settle_s": time.monotonic() - done, "rows": n["n"],
            "rows_ok": n["n"] == want and n["d"] == want and sum(p["file_rows"] for p in parts) == want}


def _lifecycle_done(parts: list, row_threshold: int = 1) -> bool:
    """No chunk of `parts` (status partitions) is persisting or compacting, each holds fewer than
    `row_threshold` unpersisted rows and at most one persisted chunk (the lifecycle compacts a cold
    partition's persisted chunks into one; a persist split by time makes one chunk of two files)."""
    return all(p["unpersisted_rows"] < row_threshold
               and sum(c["state"] in ("persisted", "unloaded") for c in p["chunk_list"]) <= 1
               and not any(c["state"] in ("persisting", "compacting") for c in p["chunk_list"]) for p in parts)


def _poll_partitions(srv, tables: list, done, timeout_s: float) -> tuple[list, bool]:
    """Polls the status of `tables`' partitions until `done(partitions)` holds (some partition
    must exist) or `timeout_s` passed; returns the last partitions seen and whether it held."""
    deadline = time.monotonic() + timeout_s
    while True:
        parts = [p for p in status_partitions(srv.client.status(DB), DB) if p["table"] in tables]
        ok = bool(parts) and done(parts)
        if ok or time.monotonic() >= deadline:
            return parts, ok
        time.sleep(0.2)
