"""`python -m bench [--quick|--full] [--only NAME,...]`: run the benchmarks, print the table, write JSON.

Starts everything itself: `iox serve` (with its embedded Tansu broker) as a
subprocess in a temporary data directory, a separate baseline Spark
application (bench/spark_worker.py), and the in-process baselines. Each
scenario is bounded in time or size; `--quick` scales sizes down (and says so
in each row's `size`) and finishes in under 3 minutes on a 2-core machine.

Order (one server process, restarted once by the restart scenario):
parse -> [server A] e2e (+files) -> restart (SIGKILL A, start B on the same
data directory) -> write -> latency -> query (+persist, memory/point) -> overload.
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

from . import harness
from .harness import Row

SCENARIOS = ["parse", "e2e", "restart", "write", "latency", "query", "overload"]

SIZES = {
    "quick": dict(parse_lines=100_000, repeat=2, clients=4, write_s=5, write_batches_per_table=8, e2e_s=10,
                  e2e_batches_per_table=10, settle_s=3, sink_timeout_s=150,
                  e2e_persist_row_threshold=100_000, restart_points=100_000, lat_s=5,
                  probe_interval_s=0.2, query_points=300_000, overload_s=4, driver_memory="4g"),
    "full": dict(parse_lines=1_000_000, repeat=5, clients=4, write_s=20, write_batches_per_table=20, e2e_s=60,
                 e2e_batches_per_table=20, settle_s=10, sink_timeout_s=900,
                 e2e_persist_row_threshold=1_000_000, restart_points=2_000_000, lat_s=30,
                 probe_interval_s=0.2, query_points=10_000_000, overload_s=30, driver_memory="8g"),
}
#: server A (end-to-end, files): lifecycle persists by row threshold (sizes' e2e_persist_row_threshold;
#: IOx's default 1M in full mode) once the late-arrive window passed
SERVER_A_ARGS = ["--late-arrive-window-s", "2"]
#: server B (everything else): only explicit Persist calls persist
SERVER_B_ARGS = ["--persist-row-threshold", "1000000000"]


class Context:
    def __init__(self, mode: str, tmp: str):
        self.mode = mode
        self.sizes = SIZES[mode]
        self.tmp = tmp
        self.partitions = 4
        self.server: harness.ServerProcess | None = None
        self.worker: harness.SparkWorker | None = None
        self.figures: dict = {}
        self.server_args_after_restart = SERVER_B_ARGS


def _run_scenario(name: str, ctx: Context) -> list[Row]:
    from .scenarios import end_to_end, latency, overload, parse_throughput, query_latency, restart, write_throughput

    mod = {"parse": parse_throughput, "e2e": end_to_end, "restart": restart, "write": write_throughput,
           "latency": latency, "query": query_latency, "overload": overload}[name]
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
    machine = harness.machine_info()
    started = time.time()
    t_start = time.monotonic()
    rows: list[Row] = []
    timings: dict = {}
    print(f"iox bench ({mode}) on {machine['cores']} cores, {machine['memory_gib']} GiB, {machine['cpu_model']}; "
          f"scratch {ctx.tmp}", flush=True)
    try:
        for name in selected:
            needs_server = name != "parse"
            t0 = time.monotonic()
            try:
                if needs_server and ctx.server is None:
                    args = (SERVER_A_ARGS + ["--persist-row-threshold", str(ctx.sizes["e2e_persist_row_threshold"])]
                            if name == "e2e" else SERVER_B_ARGS)
                    ctx.server = harness.ServerProcess(os.path.join(ctx.tmp, "server"), args,
                                                       ctx.sizes["driver_memory"], ctx.partitions)
                    secs = ctx.server.start()
                    print(f"  server up in {secs:.1f} s (pid {ctx.server.pid})", flush=True)
                    timings["server_start"] = secs
                elif needs_server and name != "restart" and ctx.server.extra_args != SERVER_B_ARGS \
                        and name != "e2e":
                    ctx.server.stop()  # --only without restart: switch to server B's rules cleanly
                    ctx.server.start(extra_args=SERVER_B_ARGS)
                if name in ("e2e", "restart", "query") and ctx.worker is None:
                    ctx.worker = harness.SparkWorker(os.path.join(ctx.tmp, "spark-worker"),
                                                     ctx.sizes["driver_memory"])
                    print(f"  baseline Spark up (its own start: {ctx.worker.ready['start_seconds']:.1f} s)",
                          flush=True)
                out = _run_scenario(name, ctx)
            except Exception as e:
                traceback.print_exc()
                out = [Row(f"{name} (failed)", "", None, note=f"not measured: {type(e).__name__}: {e}"[:400])]
            timings[name] = time.monotonic() - t0
            for r in out:
                print(f"  {r.name}: ours {harness.fmt_num(r.ours)} {r.unit}"
                      f"{'' if r.baseline is None else f', baseline {harness.fmt_num(r.baseline)}'}"
                      f"{'' if r.ratio is None else f', ratio {r.ratio:.2f}'} -> met {r.met}", flush=True)
            rows += out
            print(f"[{name}] {timings[name]:.1f} s (total {time.monotonic() - t_start:.0f} s)", flush=True)
    finally:
        if ctx.worker is not None:
            ctx.worker.stop()
        if ctx.server is not None:
            ctx.server.kill9()  # nothing to keep: a clean stop would persist everything first
            ctx.server.stop_broker()
        if not a.keep:
            shutil.rmtree(ctx.tmp, ignore_errors=True)
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    total = time.monotonic() - t_start
    doc = {"machine": machine, "mode": mode, "started_at": _dt.datetime.fromtimestamp(started).isoformat(
        timespec="seconds"), "duration_s": round(total, 1), "phase_seconds": {k: round(v, 1) for k, v in
                                                                              timings.items()},
           "overrides": overrides, "scenarios": [r.to_json() for r in rows]}
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{_dt.date.today().isoformat()}-{mode}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    print()
    print(harness.markdown_table(doc["scenarios"], machine, mode, f"{doc['started_at']}, {total:.0f} s"))
    print(f"\nwritten {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
