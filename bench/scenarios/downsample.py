"""Scenario 10: continuous downsampling while ingest runs.

Baseline: `downsample_points` new points (one table per Kafka partition, 5,000-point batches, every
batch sent once by `clients` writers as fast as they go) written to a database with no downsampler,
timed from the first write until every acknowledged offset is applied (queryable).

Ours: the same load, to a database with a downsampler on every table (10 s windows, every tag:
`mean(usage_user),max(usage_user),count(requests)`), created once each table has a first batch
(its backfill is done before the timed load starts). A table's points are 1 ms apart (each
table's load advances its event time about ten times faster than the wall clock), so a round
emits the windows of the last seconds' writes again, as for data written as it happens. An
unmeasured load of the same size to a third database warms the server up first. Two figures, each against the baseline's rate:
ingest with the downsamplers (first write until applied: what downsampling costs ingest), and
downsampling (first write until every downsampler's progress passed the load's last offsets, with
its output acknowledged: source points per second it keeps up with). The second's note says how
long after the last acknowledged write the downsamplers caught up. It counts as met only when the
output is exact: the sum of `count_requests` over every output table equals the points written.
"""
from __future__ import annotations

import time

from bench.harness import POINTS_PER_BATCH, Laps, Row, lp_batches, recent_t0_ns, run_writers, tables_on_distinct_partitions

DB_WARM = "bench_ds_warm"
DB_PLAIN = "bench_ds_plain"
DB = "bench_ds"
DEST = "bench_ds_out"
AGGREGATES = "mean(usage_user),max(usage_user),count(requests)"
EVERY = "10s"
#: event time between two points of a table
STEP_NS = 1_000_000


def _batches(tables: list, per: int, seed: int, t0: int, per_batch: int = POINTS_PER_BATCH) -> list:
    groups = [lp_batches(t, per, seed=seed + j, t0_ns=t0, step_ns=STEP_NS, per_batch=per_batch)
              for j, t in enumerate(tables)]
    return [b for grp in zip(*groups) for b in grp]


def _emitted(c, names: list, token: dict) -> bool:
    found = {d["name"]: d for d in c.list_downsamplers(DB)}
    for n in names:
        d = found.get(n)
        if d is None or d["last_error"]:
            return False
        progress = {p["partition"]: p["next_offset"] for p in d["progress"]}
        if any(progress.get(int(kp), 0) <= off for kp, off in token.items()):
            return False
    return True


def _wait(what: str, cond, timeout_s: float = 900.0) -> float:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"downsample scenario: {what} not within {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.monotonic()


def run(ctx) -> list[Row]:
    s = ctx.sizes
    srv = ctx.server
    c = srv.client
    laps = Laps("downsample", ctx.timings)
    tables = tables_on_distinct_partitions("ds", ctx.partitions)
    n = s["downsample_points"]
    per = n // len(tables)
    span_ns = per * STEP_NS
    t0 = recent_t0_ns(3 * span_ns / 1e9 + 7200)
    st = run_writers(srv.addr, DB_WARM, _batches(tables, per, 500, t0), s["clients"], 900, once=True)
    c.wait_applied(DB_WARM, st.token, timeout_s=900)
    laps.lap("warm_up")
    # the baseline: the same load without a downsampler
    t_start = time.monotonic()
    st = run_writers(srv.addr, DB_PLAIN, _batches(tables, per, 600, t0), s["clients"], 900, once=True)
    c.wait_applied(DB_PLAIN, st.token, timeout_s=900)
    base_rate = st.points / (time.monotonic() - t_start)
    laps.lap("baseline")
    # ours: each table exists (a first batch), has a downsampler, and the backfill is done
    first = run_writers(srv.addr, DB, _batches(tables, 1_000, 700, t0, per_batch=1_000), 1, 300, once=True,
                        points_per_batch=1_000)
    names = [c.create_downsampler(DB, t, EVERY, AGGREGATES, DEST)["name"] for t in tables]
    _wait("the backfill", lambda: _emitted(c, names, first.token))
    laps.lap("backfill")
    t_start = time.monotonic()
    st = run_writers(srv.addr, DB, _batches(tables, per, 800, t0 + 1_000 * STEP_NS), s["clients"], 900, once=True)
    t_acked = time.monotonic()
    c.wait_applied(DB, st.token, timeout_s=900)
    t_applied = time.monotonic()
    t_emitted = _wait("the downsamplers to emit the load", lambda: _emitted(c, names, st.token))
    laps.lap("load")
    # the output is exact: every point is counted once (the destination applied what it was sent)
    dest_tables = [n.split(".", 1)[1] for n in names]

    def counted():
        try:
            return sum(c.query(DEST, f"SELECT sum(count_requests) AS n FROM {t}").column("n")[0].as_py() or 0
                       for t in dest_tables)
        except Exception:  # noqa: BLE001 - the destination's last writes still being applied
            return -1

    want = st.points + first.points
    deadline = time.monotonic() + 120
    got = counted()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.5)
        got = counted()
    windows = sum(d["windows_emitted"] for d in c.list_downsamplers(DB))
    for name in names:
        c.drop_downsampler(name)
    laps.lap("check")
    size = f"{st.points:,} points, {len(tables)} tables, {EVERY} windows"
    ingest = Row("ingest with a downsampler on every table", "points/s", st.points / (t_applied - t_start),
                 "the same ingest without downsamplers", base_rate, target="report (what downsampling costs ingest)",
                 size=size, note=f"acknowledged in {t_acked - t_start:.1f} s, applied {t_applied - t_acked:.1f} s later")
    ingest.met = True
    emitted = Row("downsampling while ingest runs (source points emitted per second)", "points/s",
                  st.points / (t_emitted - t_start), "the same ingest without downsamplers", base_rate,
                  target="every point counted once in the output", size=size,
                  note=f"caught up {t_emitted - t_acked:.1f} s after the last acknowledged write; "
                       f"{windows:,} windows emitted; output counts {got:,} of {want:,} points")
    emitted.met = got == want
    return [ingest, emitted]
