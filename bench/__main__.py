"""`python -m bench [--quick|--full] [--only NAME,...] [--spark-master URL]`: run the benchmarks, print the table, write JSON.

Starts everything itself: `iox serve` (with its embedded Tansu broker) as a
subprocess in a temporary data directory, a separate baseline Spark
application (bench/spark_worker.py), and the in-process baselines. Each
scenario is bounded in time or size; `--quick` scales sizes down (and says so
in each row's `size`) and finishes in under 3 minutes on a 2-core machine.

Order (one server process, restarted once by the restart scenario):
parse -> [broker + baseline warm-up topic; baseline Spark and server A start
together, the server at CPU priority nice 19 until the baseline is up; the
baseline warms up while server A finishes starting] e2e (+files) -> restart
(SIGKILL A, start B on the same data directory) -> write -> latency -> query
(+persist, memory/point) -> overload -> downsample. Sub-phase times go to phase_seconds as
"<scenario>.<part>".
Server A shortens the late-arrive window so the lifecycle persists during the
end-to-end run; server B persists only when asked (by row threshold never), so
the query scenario controls what is in memory and what is persisted.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

from bench import harness
from bench.harness import Row

SCENARIOS = ["parse", "e2e", "restart", "write", "latency", "query", "overload", "downsample", "pool", "pool_refresh"]
#: scenarios that start their own processes (no shared server)
SELF_CONTAINED = ("parse", "pool", "pool_refresh")
#: scenarios whose baseline runs in the separate baseline Spark application
WORKER_SCENARIOS = ("e2e", "restart", "query")

SIZES = {
    "quick": dict(parse_lines=100_000, repeat=2, query_repeat=2, settle_quiet_s=3.0, clients=4, write_s=3, write_batches_per_table=8, e2e_s=4,
                  e2e_batches_per_table=10, settle_s=15, sink_timeout_s=150,
                  e2e_persist_row_threshold=100_000, e2e_cold_s=5, files_persists=3, e2e_paced_tries=1, restart_points=100_000, lat_s=5,
                  probe_interval_s=0.2, query_points=200_000, overload_s=3, overload_memory_limit="", driver_memory="4g",
                  worker_memory="4g", visibility_points_per_s=0, pool_points=300_000, pool_refresh_files=2_000,
                  pool_refresh_deletes=200, downsample_points=200_000),
    "full": dict(parse_lines=1_000_000, repeat=5, query_repeat=9, settle_quiet_s=5.0, clients=4, write_s=20, write_batches_per_table=20, e2e_s=60,
                 e2e_batches_per_table=20, settle_s=180, sink_timeout_s=900,
                 e2e_persist_row_threshold=1_000_000, e2e_cold_s=30, files_persists=120, e2e_paced_tries=2, restart_points=2_000_000, lat_s=30,
                 probe_interval_s=0.2, query_points=10_000_000, overload_s=30, overload_memory_limit="", driver_memory="6g",
                 worker_memory="5g", visibility_points_per_s=0, pool_points=2_400_000, pool_refresh_files=10_000,
                 pool_refresh_deletes=1_000, downsample_points=2_000_000),
}
#: visibility_points_per_s: the visibility load; 0 = half the end-to-end figure of the same run
#: (a value is for experiments with --only, e.g. --set visibility_points_per_s=260000)
#: server A (end-to-end, files): lifecycle persists by row threshold (sizes' e2e_persist_row_threshold;
#: IOx's default 1M in full mode) once the late-arrive window passed; a partition's files are
#: compacted from 2 on once it had no write for sizes' e2e_cold_s (--persisted-compaction-cold-s,
#: 300 s by default: the bench waits for that compaction after each run). 30 s in full mode is
#: several times the gap between the micro-batches that write a partition under load (4-12 s),
#: so the partitions of a sustained run are not rewritten between two of them.
SERVER_A_ARGS = ["--late-arrive-window-s", "2"]
#: server B (everything else): only explicit Persist calls persist
SERVER_B_ARGS = ["--persist-row-threshold", "1000000000"]


def cluster_server_args(master: str, server_extra: list) -> list:
    """`iox serve` arguments that put our servers on the Spark master `master`: the bench's own
    object store directory is declared shared (the bench runs the cluster's workers on this host)
    unless `server_extra` names an object store (e.g. S3 for workers on other hosts). Pure."""
    named = any(x == "--object-store" or x.startswith("--object-store=") for x in server_extra)
    return ["--spark-master", master] + ([] if named else ["--object-store-shared"])


class Context:
    def __init__(self, mode: str, tmp: str):
        self.mode = mode
        self.sizes = SIZES[mode]
        self.tmp = tmp
        self.partitions = 4
        self.server: harness.ServerProcess | None = None
        self.worker: harness.SparkWorker | None = None
        self.figures: dict = {}
        #: phase_seconds of the run; scenarios add sub-phases as "<scenario>.<part>" (harness.Laps)
        self.timings: dict = {}
        #: `--server-arg`s, added to both servers' arguments
        self.server_extra: list = []
        self.server_args_after_restart = SERVER_B_ARGS
        #: how the baseline Spark application's start was measured (the restart row says it)
        self.worker_start_note = ""
        #: end_to_end.BaselineWarmup, started as soon as the baseline Spark application is up
        self.baseline_warmup = None
        #: the query scenario's points and plain-Parquet baseline, made by query_latency.prepare_baseline
        self.query_prepared = None


def _start_server_and_worker(ctx: Context, args: list, selected: list) -> None:
    """Starts the server and, when a selected scenario needs it, the baseline Spark application.

    Both start at once, but the baseline's start is a figure (Spark's own start time, the restart
    scenario's baseline) and must not be slowed by the server's start: while the baseline starts,
    the server's whole session (driver, JVM, Python workers) runs at autogroup nice 19, i.e. only on
    CPU time the baseline leaves idle; then it is set back to 0 before anything of ours is measured.
    Where session priorities cannot be set, the two start one after the other.

    With e2e selected, the bench starts the embedded broker first (the server reuses it, as `iox serve`
    does with a running broker recorded in its data directory) and puts the baseline's warm-up topic on
    it, so the baseline's (unmeasured) warm-up runs as soon as its Spark is up, while our server still starts.
    """
    timings = ctx.timings
    with_worker = any(s in WORKER_SCENARIOS for s in selected)
    ctx.server = harness.ServerProcess(os.path.join(ctx.tmp, "server"), args, ctx.sizes["driver_memory"],
                                       ctx.partitions)
    if not with_worker:
        secs = ctx.server.start()
    else:
        if "e2e" in selected:
            from iox_spark.server.runtime.broker import start_or_reuse

            from bench.scenarios.end_to_end import BaselineWarmup

            tb = time.monotonic()
            broker = start_or_reuse(ctx.server.data_dir, storage=_broker_storage(args))
            ctx.baseline_warmup = BaselineWarmup(ctx, broker.bootstrap)
            timings["broker_and_warm_topic"] = time.monotonic() - tb
        t0 = time.monotonic()
        ctx.worker = harness.SparkWorker(os.path.join(ctx.tmp, "spark-worker"), ctx.sizes["worker_memory"],
                                         wait=False)
        overlap = harness.session_nice_supported()
        if overlap:
            ctx.server.launch()
            overlap = harness.set_session_nice(ctx.server.pid, 19)
            if not overlap:  # could not deprioritise it after all: start the baseline alone
                ctx.server.kill9()
        ready = ctx.worker.wait_ready()
        if overlap:
            harness.set_session_nice(ctx.server.pid, 0)
            ctx.worker_start_note = ("started while our server A started at autogroup nice 19 and its Spark JVM "
                                     "in its own session at nice 10 (CPU priority to the baseline)")
        else:
            ctx.server.launch()
            ctx.worker_start_note = "started alone"
        if ctx.baseline_warmup is not None:
            ctx.baseline_warmup.start()
        timings["spark_worker_start"] = time.monotonic() - t0
        print(f"  baseline Spark up (its own start: {ready['start_seconds']:.1f} s; {ctx.worker_start_note})",
              flush=True)
        secs = ctx.server.wait_ready()
    print(f"  server up in {secs:.1f} s (pid {ctx.server.pid})", flush=True)
    timings["server_start"] = secs
    if harness.MemoryWatch.current is not None:
        harness.MemoryWatch.current.record("server_start")


def _release_baseline(ctx: Context, selected: list) -> None:
    """After the end-to-end scenario the baseline Spark application is only needed for the query
    scenario's plain-Parquet baseline: run it now (our server is idle), then stop the application,
    which holds GiBs the later scenarios need (the restart row keeps its start time)."""
    if ctx.worker is None or ctx.worker.proc.poll() is not None:
        return
    if "query" in selected:
        from bench.scenarios import query_latency

        try:
            query_latency.prepare_baseline(ctx)
        except Exception:  # the query scenario measures without its baseline then
            traceback.print_exc()
    ctx.worker.stop(graceful=True)
    print("  baseline Spark application stopped (the rest of the run does not use it)", flush=True)


def _broker_storage(args: list) -> str:
    """The embedded broker storage our servers' arguments ask for (`--broker-storage[=]X`), else the default."""
    from iox_spark.server.runtime.broker import DEFAULT_BROKER_STORAGE

    for i, a in enumerate(args):
        if a.startswith("--broker-storage="):
            return a.split("=", 1)[1]
        if a == "--broker-storage" and i + 1 < len(args):
            return args[i + 1]
    return DEFAULT_BROKER_STORAGE


def _watched_processes(ctx: Context) -> dict:
    """{label: pid} of the run's processes for the memory watch (absent ones left out)."""
    out = {}
    if ctx.server is not None and ctx.server.proc is not None and ctx.server.proc.poll() is None:
        out["server"] = ctx.server.pid
        try:
            with open(os.path.join(ctx.server.data_dir, "broker.json")) as f:
                rec = json.load(f)
            out["broker"] = int(rec["pid"])
            if rec.get("store_pid"):
                out["broker_store"] = int(rec["store_pid"])
        except (OSError, ValueError, KeyError):
            pass
    if ctx.worker is not None and ctx.worker.proc.poll() is None:
        out["baseline_spark"] = ctx.worker.pid
    return out


def _run_scenario(name: str, ctx: Context) -> list[Row]:
    from bench.scenarios import (downsample, end_to_end, latency, overload, parse_throughput, pool, pool_refresh,
                                 query_latency, restart, write_throughput)

    mod = {"parse": parse_throughput, "e2e": end_to_end, "restart": restart, "write": write_throughput,
           "latency": latency, "query": query_latency, "overload": overload, "pool": pool,
           "pool_refresh": pool_refresh, "downsample": downsample}[name]
    return mod.run(ctx)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="scaled-down sizes, < 3 minutes (default)")
    g.add_argument("--full", action="store_true", help="the issue's sizes (10M points, 60 s, 2M restart)")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one size (development; the JSON records overrides)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="an extra `iox serve` argument for our servers, e.g. --server-arg=--spark-nice=0 "
                         "(experiments; the JSON records them; never passed to the baselines)")
    ap.add_argument("--spark-master", default="", metavar="URL",
                    help="run our servers on this Spark master (e.g. spark://host:7077) instead of local[*]; "
                         "their object store is the bench's directory declared shared (a cluster on this host) "
                         "unless a --server-arg=--object-store=... is given (the baselines stay local)")
    a = ap.parse_args(argv)
    mode = "full" if a.full else "quick"
    selected = [s.strip() for s in a.only.split(",") if s.strip()] or list(SCENARIOS)
    for s in selected:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    if "latency" in selected and "write" not in selected:
        selected.append("write")  # latency runs at half of the measured maximum
    selected = [s for s in SCENARIOS if s in selected]

    ctx = Context(mode, tempfile.mkdtemp(prefix="iox-bench-"))
    overrides = {}
    for kv in a.set:
        k, _, v = kv.partition("=")
        if k not in ctx.sizes:
            ap.error(f"unknown size {k!r}; choose from {', '.join(ctx.sizes)}")
        overrides[k] = type(ctx.sizes[k])(v)
    ctx.sizes = dict(ctx.sizes, **overrides)
    if a.server_arg:
        ctx.server_extra = list(a.server_arg)
        ctx.server_args_after_restart = SERVER_B_ARGS + ctx.server_extra
        overrides["server_args"] = ctx.server_extra
    if a.spark_master:
        ctx.server_extra = ctx.server_extra + cluster_server_args(a.spark_master, ctx.server_extra)
        ctx.server_args_after_restart = SERVER_B_ARGS + ctx.server_extra
        overrides["spark_master"] = a.spark_master
    machine = harness.machine_info()
    started = time.time()
    t_start = time.monotonic()
    rows: list[Row] = []
    timings = ctx.timings
    print(f"iox bench ({mode}) on {machine['cores']} cores, {machine['memory_gib']} GiB, {machine['cpu_model']}; "
          f"scratch {ctx.tmp}", flush=True)
    watch = harness.MemoryWatch(lambda: _watched_processes(ctx)).__enter__()
    try:
        for name in selected:
            needs_server = name not in SELF_CONTAINED
            if name == "pool" and ctx.server is not None:  # the pool's members get the machine to themselves
                ctx.server.kill9()
                ctx.server.stop_broker()
                ctx.server = None
            t0 = time.monotonic()
            try:
                if needs_server and ctx.server is None:
                    args = (SERVER_A_ARGS + ["--persist-row-threshold", str(ctx.sizes["e2e_persist_row_threshold"]),
                                             "--persisted-compaction-cold-s", str(ctx.sizes["e2e_cold_s"])]
                            if name == "e2e" else SERVER_B_ARGS) + ctx.server_extra
                    _start_server_and_worker(ctx, args, selected)
                elif needs_server and name != "restart" and ctx.server.extra_args != ctx.server_args_after_restart \
                        and name != "e2e":
                    ctx.server.stop()  # --only without restart: switch to server B's rules cleanly
                    ctx.server.start(extra_args=ctx.server_args_after_restart)
                out = _run_scenario(name, ctx)
            except Exception as e:
                traceback.print_exc()
                why = ctx.server.diagnose() if ctx.server is not None else ""
                out = [Row(f"{name} (failed)", "", None, note=f"not measured: {type(e).__name__}: {e}"[:400]
                           + (f"; {why}"[:800] if why else ""))]
            watch.record(f"{name}.end")
            timings[name] = time.monotonic() - t0
            for r in out:
                print(f"  {r.name}: ours {harness.fmt_num(r.ours)} {r.unit}"
                      f"{'' if r.baseline is None else f', baseline {harness.fmt_num(r.baseline)}'}"
                      f"{'' if r.ratio is None else f', ratio {r.ratio:.2f}'} -> met {r.met}", flush=True)
            rows += out
            print(f"[{name}] {timings[name]:.1f} s (total {time.monotonic() - t_start:.0f} s)", flush=True)
            if name == "e2e":
                _release_baseline(ctx, selected)
    finally:
        watch.__exit__(None, None, None)
        t_end = time.monotonic()
        if ctx.worker is not None:
            ctx.worker.stop(graceful=False)  # nothing of it is kept
        if ctx.server is not None:
            ctx.server.kill9()  # nothing to keep: a clean stop would persist everything first
            ctx.server.stop_broker()
        if not a.keep:
            shutil.rmtree(ctx.tmp, ignore_errors=True)
        timings["teardown"] = time.monotonic() - t_end
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    total = time.monotonic() - t_start
    doc = {"machine": machine, "mode": mode, "started_at": _dt.datetime.fromtimestamp(started).isoformat(
        timespec="seconds"), "duration_s": round(total, 1), "phase_seconds": {k: round(v, 1) for k, v in
                                                                              timings.items()},
           "overrides": overrides, "memory_gib": watch.phases, "scenarios": [r.to_json() for r in rows],
           "spark_master": a.spark_master or "local[*]"}
    os.makedirs(a.out, exist_ok=True)
    only = "-" + "-".join(selected) if a.only else ""  # a subset never replaces a whole run's results
    path = os.path.join(a.out, f"{_dt.date.today().isoformat()}-{mode}{'-cluster' if a.spark_master else ''}"
                               f"{only}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    print()
    print(harness.markdown_table(doc["scenarios"], machine, mode, f"{doc['started_at']}, {total:.0f} s"
                                 + (f", our servers on Spark master {a.spark_master}" if a.spark_master else "")))
    print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
