"""Shared helpers of the benchmarks: machine facts, the server subprocess, the
baseline Spark worker, data generation, latency statistics and the result rows.

Nothing here asserts a speed: the harness measures and reports.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IOX = os.path.join(os.path.dirname(sys.executable), "iox")
POINTS_PER_BATCH = 5_000
#: every generated point is one row of this shape: 2 tags, 3 fields, time
TAG_KEYS = ("host", "region")
FIELD_KEYS = (("usage_user", "float"), ("usage_system", "float"), ("requests", "integer"))


# ---------------------------------------------------------------- machine
def machine_info() -> dict:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {"cores": os.cpu_count(), "memory_bytes": mem, "memory_gib": round(mem / 2**30, 1),
            "cpu_model": model, "os": platform.platform(), "python": platform.python_version(),
            "loadavg_at_start": [round(x, 2) for x in load]}


# ---------------------------------------------------------------- results
@dataclass
class Row:
    """One scenario figure. `better` says which direction wins ("higher" or "lower")."""
    name: str
    unit: str
    ours: float | None
    baseline_name: str | None = None
    baseline: float | None = None
    target: str | None = None
    met: bool = False
    size: str = ""
    note: str = ""
    better: str = "higher"
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return ratio(self.ours, self.baseline)

    def to_json(self) -> dict:
        d = {"name": self.name, "unit": self.unit, "ours": _round(self.ours), "baseline_name": self.baseline_name,
             "baseline": _round(self.baseline), "ratio": _round(self.ratio, 3), "target": self.target,
             "met": bool(self.met), "size": self.size, "note": self.note}
        if self.extra:
            d["extra"] = self.extra
        return d


def ratio(ours, baseline) -> float | None:
    """ours / baseline, or None when either is missing or the baseline is zero."""
    if ours is None or baseline is None or baseline == 0:
        return None
    return ours / baseline


def _round(x, nd: int = 4):
    if x is None:
        return None
    if isinstance(x, float):
        if x != x:  # NaN
            return None
        return round(x, nd) if abs(x) < 1000 else round(x, 1)
    return x


def percentile(values, p: float) -> float | None:
    """The p-th percentile (0..100, linear interpolation) or None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), p))


def write_stage_buckets(http_port: int) -> dict:
    """{stage: {bucket upper bound in s (inf for +Inf): cumulative count}} of the server's
    `iox_write_stage_seconds` histograms (GET /metrics, server/metrics.py)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == "iox_write_stage_seconds_bucket":
                out.setdefault(smp.labels["stage"], {})[float(smp.labels["le"])] = smp.value
    return out


def stage_percentiles_ms(before: dict, after: dict, ps=(50, 99)) -> dict:
    """{stage: (requests, [bucket upper bound in ms holding the p-th percentile, per p])} of the
    requests observed between two `write_stage_buckets` scrapes; stages without any are left out.
    A bound, not a value: the percentile lies in the bucket below it."""
    out = {}
    for stage, cum in after.items():
        les = sorted(cum)
        delta = [cum[le] - before.get(stage, {}).get(le, 0.0) for le in les]
        n = delta[-1]
        if n <= 0:
            continue
        out[stage] = (int(n), [next(le for le, c in zip(les, delta) if c >= n * p / 100) * 1000 for p in ps])
    return out


def fmt_num(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    ax = abs(x)
    if ax >= 1e6:
        return f"{x / 1e6:.2f}M"
    if ax >= 1e4:
        return f"{x / 1e3:.0f}k"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _met(r: dict) -> str:
    if not r.get("target") or r.get("target") == "report":
        return "—"
    return "yes" if r.get("met") else "**no**"


def markdown_table(rows: list[dict], machine: dict, mode: str, when: str) -> str:
    out = [f"Machine: {machine.get('cores')} cores, {machine.get('memory_gib')} GiB, {machine.get('cpu_model')}"
           f" — mode `{mode}`, {when}", "",
           "| scenario | unit | ours | baseline | baseline figure | ratio | target | met | size / note |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        note = "; ".join(x for x in (r.get("size"), r.get("note")) if x)
        out.append(f"| {r['name']} | {r['unit']} | {fmt_num(r['ours'])} | {r.get('baseline_name') or '—'} | "
                   f"{fmt_num(r.get('baseline'))} | {fmt_num(r.get('ratio'))} | {r.get('target') or '—'} | "
                   f"{_met(r)} | {note.replace('|', '/')} |")
    return "\n".join(out)


class Laps:
    """Sub-phase stopwatch: `lap(name)` records the seconds since the previous lap as `<prefix>.<name>`
    in `sink` (the run's phase_seconds) and prints it; with the run's `MemoryWatch` running
    (`MemoryWatch.current`), also that sub-phase's memory figures in the watch's `phases`."""

    def __init__(self, prefix: str, sink: dict | None):
        self.prefix = prefix
        self.sink = sink if sink is not None else {}
        self.t = time.monotonic()
        if MemoryWatch.current is not None:
            MemoryWatch.current.take()  # what came before this scenario is not its first lap's

    def lap(self, name: str) -> float:
        now = time.monotonic()
        dt = now - self.t
        self.t = now
        key = f"{self.prefix}.{name}"
        self.sink[key] = self.sink.get(key, 0.0) + dt
        mem = ""
        if MemoryWatch.current is not None:
            m = MemoryWatch.current.record(key)
            if m:
                mem = f" (available >= {m['min_available_gib']} GiB; peak RSS GiB {m['peak_rss_gib']})"
        print(f"    {key}: {dt:.1f} s{mem}", flush=True)
        return dt


def mem_available_bytes() -> int:
    """The kernel's estimate of memory available for new allocations (MemAvailable), 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemoryWatch:
    """Samples the machine's available memory and the RSS of the run's processes (broker, server
    tree, baseline Spark application tree) every `interval_s` in a thread, so a run that runs out
    of memory says where. `record(key)` stores the lowest available memory and each process's peak
    RSS since the previous `record`/`take` under `phases[key]` (the JSON's `memory_gib`).

    `processes` is called at every sample and returns {label: pid} (a pid may change: the server
    restarts). One watch per run, published as `MemoryWatch.current` for `Laps`."""

    current: "MemoryWatch | None" = None

    def __init__(self, processes, interval_s: float = 1.0):
        self.processes = processes
        self.interval_s = interval_s
        self.phases: dict = {}
        self._lock = threading.Lock()
        self._reset()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _reset(self) -> None:
        self._min_avail: int | None = None
        self._peaks: dict = {}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            avail = mem_available_bytes()
            try:
                rss = {label: tree_rss_bytes(pid) for label, pid in self.processes().items() if pid}
            except Exception:  # noqa: BLE001 - a process went away between listing and reading
                rss = {}
            with self._lock:
                if avail and (self._min_avail is None or avail < self._min_avail):
                    self._min_avail = avail
                for label, v in rss.items():
                    self._peaks[label] = max(self._peaks.get(label, 0), v)

    def take(self) -> dict:
        """The figures since the previous take, and a fresh interval."""
        with self._lock:
            out = {"min_available_gib": None if self._min_avail is None else round(self._min_avail / 2**30, 2),
                   "peak_rss_gib": {k: round(v / 2**30, 2) for k, v in sorted(self._peaks.items())}}
            self._reset()
        return out

    def record(self, key: str) -> dict | None:
        m = self.take()
        if m["min_available_gib"] is None and not m["peak_rss_gib"]:
            return None
        self.phases[key] = m
        return m

    def __enter__(self) -> "MemoryWatch":
        MemoryWatch.current = self
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(5)
        MemoryWatch.current = None


# ---------------------------------------------------------------- processes
def session_nice_supported() -> bool:
    """True when the CPU priority of a whole session can be set (and reset) through its autogroup."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            if f.read().strip() != "1":
                return False
        with open("/proc/self/autogroup") as f:
            nice = f.read().split()[-1]
        with open("/proc/self/autogroup", "w") as f:  # writing the current value back: a permission check
            f.write(nice)
        return os.geteuid() == 0  # lowering a nice value again needs CAP_SYS_NICE
    except (OSError, IndexError):
        return False


def set_session_nice(pid: int, nice: int) -> bool:
    """Sets the CPU weight of the autogroup (session) of `pid`: every process and thread of it (the
    server's Python driver, JVM and Python workers) at once. False when it could not be set."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
        return True
    except OSError:
        return False


class RealtimeClients:
    """While entered, every thread of this (the bench's) process runs under SCHED_RR, threads started
    meanwhile inherit it, and on exit all of them are back under the normal policy. For the latency
    loads: the writers stand in for clients on machines of their own, whose requests never wait for
    a core behind the server's Spark JVM; on this shared 2-core machine they would, and that wait
    would count in the round trip. `raised` says whether the kernel allowed it (the row notes it)."""

    def __init__(self, priority: int = 1):
        self.priority = priority
        self.raised = False

    def __enter__(self) -> "RealtimeClients":
        from iox_spark.server.runtime.write_path_priority import raise_write_path_priority

        [res] = raise_write_path_priority([os.getpid()], self.priority)
        self.raised = res.not_raised is None
        return self

    def __exit__(self, *exc) -> None:
        normal = os.sched_param(0)
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setscheduler(int(tid), os.SCHED_OTHER, normal)
            except (ProcessLookupError, PermissionError):
                pass


def _state(pid: int) -> str | None:
    """The /proc state letter of a process, None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie counts as gone (and is reaped when it is our child)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return _state(pid) not in (None, "Z", "X")


def group_alive(pgid: int) -> bool:
    """True while a process of the group runs (zombies waiting for a parent to reap them do not count)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict:
    kids: dict = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def process_tree(pid: int) -> list[int]:
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its descendants (the server: Python driver + JVM + Python workers)."""
    return sum(rss_bytes(p) for p in process_tree(pid))


class RssSampler:
    """Samples the RSS of a process tree in a thread; `peak` is the largest sample."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.samples: list = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            v = tree_rss_bytes(self.pid)
            self.samples.append(v)
            self.peak = max(self.peak, v)
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(5)


class ServerProcess:
    """`iox serve` as a subprocess on free ports, the embedded broker, a data directory of its own."""

    def __init__(self, data_dir: str, extra_args: list | None = None, driver_memory: str = "4g",
                 partitions: int = 4, cpus: frozenset | None = None):
        """`cpus`: the cores the server (its JVM and Python workers, which inherit it) may run on,
        as `taskset -c` would pin it; None: any."""
        self.data_dir = data_dir
        self.cpus = cpus
        self.extra_args = list(extra_args or [])
        self.driver_memory = driver_memory
        self.partitions = partitions
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.http_port: int | None = None
        self.client = None
        self.start_seconds: float | None = None
        self._logs = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 240.0, extra_args: list | None = None) -> float:
        """Launches the server and waits until it serves; returns the seconds from launch to ready."""
        self.launch(extra_args)
        return self.wait_ready(timeout_s)

    def launch(self, extra_args: list | None = None) -> None:
        from iox_spark.server.api.client import IoxClient

        if extra_args is not None:
            self.extra_args = list(extra_args)
        os.makedirs(self.data_dir, exist_ok=True)
        self.port = free_port()
        self.http_port = free_port()  # GET /metrics: the router's stage histograms (server/metrics.py)
        self._logs += 1
        log = open(os.path.join(self.data_dir, f"server-{self._logs}.log"), "ab")
        cmd = [IOX, "serve", "--data-dir", self.data_dir, "--grpc-port", str(self.port),
               "--http-port", str(self.http_port),
               "--spark-connect-port", "0", "--driver-memory", self.driver_memory,
               "--partitions", str(self.partitions), "--log-level", "WARNING"] + self.extra_args
        env = dict(os.environ)
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        self._t_launch = time.monotonic()
        cpus = self.cpus
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=self.data_dir,
                                     env=env, start_new_session=True,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        log.close()
        self.client = IoxClient(self.addr)

    def wait_ready(self, timeout_s: float = 240.0) -> float:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"iox serve exited with {self.proc.returncode}; see {self.data_dir}/server-*.log")
            try:
                self.client.wait_ready(timeout_s=2)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
        self.start_seconds = time.monotonic() - self._t_launch
        return self.start_seconds

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss(self) -> int:
        return tree_rss_bytes(self.pid)

    def diagnose(self) -> str:
        """What is wrong with the server process, for a failed scenario's note: exited, or its JVM is
        gone, plus the last fatal-looking lines of its log ("" when nothing looks wrong)."""
        if self.proc is None:
            return ""
        out = []
        if self.proc.poll() is not None:
            out.append(f"server exited with {self.proc.returncode}")
        elif not any(_cmdline(p).startswith("java") or "/java" in _cmdline(p).split(" ", 1)[0]
                     for p in process_tree(self.pid)[1:]):
            out.append("the server's Spark JVM is gone")
        path = os.path.join(self.data_dir, f"server-{self._logs}.log")
        marks = ("OutOfMemoryError", "Killed", "FATAL", "fatal error", "Py4JNetworkError", "SIGKILL",
                 "Connection refused")
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 4 * 2**20))
                lines = [ln.decode("utf-8", "replace").strip() for ln in f.read().replace(b"\r", b"\n").splitlines()]
            hits = [ln[:240] for ln in lines if any(m in ln for m in marks)]
            if hits:
                out.append("log: " + " | ".join(dict.fromkeys(hits[-3:])))
        except OSError:
            pass
        return "; ".join(out)

    def kill9(self) -> None:
        """SIGKILL the server's whole process group at once (a crash: driver, JVM and Python workers die
        together, nothing is flushed). The broker lives on (its own session)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._reap_group()

    def _reap_group(self, timeout_s: float = 15.0) -> None:
        # the JVM notices its parent died and exits; make sure nothing of the group stays
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not group_alive(self.proc.pid):
                return
            time.sleep(0.05)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reap_group(5)

    def broker_bootstrap(self) -> str:
        with open(os.path.join(self.data_dir, "broker.json")) as f:
            return f"127.0.0.1:{json.load(f)['port']}"

    def stop_broker(self) -> None:
        """Stops the embedded broker this data directory recorded (started by our server or the bench),
        and a durable one's store."""
        rec = os.path.join(self.data_dir, "broker.json")
        if not os.path.exists(rec):
            return
        with open(rec) as f:
            r = json.load(f)
        if r.get("store_pid"):
            from iox_spark.server.runtime.broker import BrokerHandle

            BrokerHandle(pid=int(r["pid"]), port=int(r["port"]), storage=r["storage"], owned=True,
                         record_path=rec, store_pid=int(r["store_pid"]), store_port=r.get("store_port"),
                         store_dir=r.get("store_dir"), pid_start=r.get("pid_start"),
                         store_pid_start=r.get("store_pid_start")).stop()
            return
        pid = int(r["pid"])
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(200):
            if not pid_alive(pid):
                return
            time.sleep(0.05)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SparkWorker:
    """The baseline Spark application (bench/spark_worker.py) in its own process; JSON lines on stdin/stdout."""

    MARK = "@@BENCH "

    def __init__(self, scratch: str, driver_memory: str = "4g", wait: bool = True):
        """Launches the worker; with `wait` also waits for its SparkSession (else call `wait_ready`)."""
        os.makedirs(scratch, exist_ok=True)
        self.scratch = scratch
        self.log_path = os.path.join(scratch, "spark-worker.log")
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.spark_worker", scratch, driver_memory],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
                                     env=env, text=True, bufsize=1, start_new_session=True)
        log.close()
        self.ready: dict | None = None
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 240.0) -> dict:
        """Waits for the worker's SparkSession; `ready["start_seconds"]` is Spark's own start time."""
        if self.ready is None:
            self.ready = self._read(timeout_s=timeout_s)
        return self.ready

    def _read(self, timeout_s: float) -> dict:
        result: list = []

        def reader():
            for line in self.proc.stdout:
                if line.startswith(self.MARK):
                    result.append(json.loads(line[len(self.MARK):]))
                    return

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        t.join(timeout_s)
        if not result:
            raise RuntimeError(f"spark worker gave no answer within {timeout_s}s (log {self.log_path})")
        if "error" in result[0]:
            raise RuntimeError(f"spark worker: {result[0]['error']}")
        return result[0]

    def call(self, cmd: str, wait_s: float = 600, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read(wait_s)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, graceful: bool = True) -> None:
        """Asks the worker to stop its SparkSession and exit; `graceful=False` kills its process group
        (the end of a run: nothing of it is kept)."""
        if graceful and self.proc.poll() is None:
            try:
                self.call("exit", wait_s=30)
            except Exception:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


# ---------------------------------------------------------------- data
def gen_table(n: int, seed: int, t0_ns: int, step_ns: int = 1_000, hosts: int = 100) -> pa.Table:
    """n points of the bench shape; times t0 + i*step (distinct, so nothing merges)."""
    rng = np.random.default_rng(seed)
    i = np.arange(n, dtype=np.int64)
    host = np.char.add("host-", (i % hosts).astype(str))
    region = np.array(["us-east", "us-west", "eu-central", "ap-south"])[(i // hosts) % 4]
    return pa.table({
        "host": pa.array(host.tolist(), pa.string()),
        "region": pa.array(region.tolist(), pa.string()),
        "usage_user": pa.array(np.round(rng.random(n) * 100, 3)),
        "usage_system": pa.array(np.round(rng.random(n) * 100, 3)),
        "requests": pa.array(rng.integers(0, 10_000, n, dtype=np.int64)),
        "time": pa.array(t0_ns + i * step_ns, pa.int64()),
    })


def to_line_protocol(measurement: str, t: pa.Table) -> bytes:
    """Line protocol of a bench table (vectorised with numpy string ops)."""
    c = {name: t.column(name).to_numpy(zero_copy_only=False) for name in t.column_names}
    parts = [np.full(t.num_rows, measurement + ",host="), c["host"], np.full(t.num_rows, ",region="), c["region"],
             np.full(t.num_rows, " usage_user="), c["usage_user"].astype(str),
             np.full(t.num_rows, ",usage_system="), c["usage_system"].astype(str),
             np.full(t.num_rows, ",requests="), c["requests"].astype(str), np.full(t.num_rows, "i "),
             c["time"].astype(str)]
    acc = parts[0].astype(object)
    for p in parts[1:]:
        acc = acc + p.astype(object)
    return ("\n".join(acc.tolist()) + "\n").encode()


def lp_batches(measurement: str, total: int, seed: int, t0_ns: int, step_ns: int = 1_000,
               per_batch: int = POINTS_PER_BATCH) -> list[bytes]:
    t = gen_table(total, seed, t0_ns, step_ns)
    return [to_line_protocol(measurement, t.slice(o, per_batch)) for o in range(0, total, per_batch)]


def recent_t0_ns(offset_s: float = 3600.0) -> int:
    """A start time an hour ago, so every point is in the past (persistable) and within a day or two."""
    return int((time.time() - offset_s) * 1e9)


def tables_on_distinct_partitions(prefix: str, partitions: int) -> list[str]:
    """One table name per Kafka partition (the router hashes the table name to a partition)."""
    from iox_spark.catalog.sharding import partition_for

    names: dict = {}
    i = 0
    while len(names) < partitions and i < 10_000:
        name = f"{prefix}{i}"
        names.setdefault(partition_for(name, partitions), name)
        i += 1
    return [names[p] for p in sorted(names)]


def status_partitions(status: dict, database: str) -> list[dict]:
    """[{table, key, files, chunks, unpersisted_rows, chunk_states}] of one database's status."""
    out = []
    for db in status.get("databases", []):
        if db.get("name") != database:
            continue
        for t in db.get("tables", []):
            for p in t.get("partitions", []):
                out.append({"table": t["name"], "key": p["key"], "files": len(p.get("files", [])),
                            "file_rows": sum(int(f["rows"]) for f in p.get("files", [])),
                            "chunks": len(p.get("chunks", [])),
                            "chunk_states": sorted({c["state"] for c in p.get("chunks", [])}),
                            "chunk_list": list(p.get("chunks", [])),
                            "chunk_bytes": sum(int(c["size_bytes"]) for c in p.get("chunks", [])),
                            "unpersisted_rows": int(p.get("unpersisted_rows", 0))})
    return out


def wait_all_applied(client, database: str, tokens: list, timeout_s: float) -> float:
    """Waits until every token is applied; returns the monotonic time it was seen."""
    merged: dict = {}
    for tok in tokens:
        for p, off in tok.items():
            merged[int(p)] = max(merged.get(int(p), -1), off)
    client.wait_applied(database, merged, timeout_s=timeout_s)
    return time.monotonic()


# ---------------------------------------------------------------- writers
@dataclass
class WriteStats:
    points: int = 0
    requests: int = 0
    seconds: float = 0.0
    latencies_s: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)
    token: dict = field(default_factory=dict)
    offered_points: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def token_now(self) -> dict:
        with self.lock:
            return dict(self.token)

    @property
    def rate(self) -> float:
        return self.points / self.seconds if self.seconds > 0 else 0.0


def distinct_cycle(body: bytes, cycle: int) -> bytes:
    """The `cycle`-th resend of a bench body as new points: cycle 0 is the body itself, cycle c >= 1
    prefixes every host tag value with "c<c>." (new series, so no point repeats an earlier one)."""
    return body if cycle == 0 else body.replace(b",host=", b",host=c%d." % cycle)


class SendFailed(Exception):
    """A request that got no acknowledgement: `name` counts it in WriteStats.errors; the writer pauses
    `backoff_s` before its next request."""

    def __init__(self, name: str, backoff_s: float = 0.0):
        super().__init__(name)
        self.name, self.backoff_s = name, backoff_s


def run_paced(connect, batches: list, clients: int, duration_s: float, rate_points_per_s: float | None,
               points_per_batch: int, stats: WriteStats, once: bool, cycle_base: int) -> WriteStats:
    """`clients` threads send `batches` for `duration_s` (the schedule `run_writers` documents).
    `connect(k)` gives thread k its (send, close): `send(body)` returns the request's write token
    ({partition: offset}, or {}) once it is acknowledged, or raises SendFailed."""
    lock = stats.lock
    start = time.monotonic()
    end = start + duration_s
    interval = None if not rate_points_per_s else points_per_batch * clients / rate_points_per_s

    def worker(k: int):
        mine = batches[k::clients] if once else (batches[k::clients] or batches)
        if not mine:
            return
        send, close = connect(k)
        lat, pts, reqs, errs, offered = [], 0, 0, {}, 0
        i = 0
        next_at = start + (interval * k / clients if interval else 0)
        try:
            while True:
                now = time.monotonic()
                if now >= end:
                    break
                if once and i >= len(mine):
                    break
                if interval:
                    if next_at >= end:  # the schedule's last request is due before the end
                        break
                    if next_at > now:
                        time.sleep(next_at - now)
                    next_at += interval
                body = distinct_cycle(mine[i % len(mine)], cycle_base + i // len(mine))
                i += 1
                offered += points_per_batch
                t0 = time.monotonic()
                try:
                    t = send(body)
                except SendFailed as e:
                    errs[e.name] = errs.get(e.name, 0) + 1
                    if e.backoff_s:
                        time.sleep(e.backoff_s)
                    continue
                lat.append(time.monotonic() - t0)
                pts += points_per_batch
                reqs += 1
                with lock:  # live token: samplers read it while the run goes on
                    for p, off in t.items():
                        stats.token[int(p)] = max(stats.token.get(int(p), -1), off)
        finally:
            close()
            with lock:
                stats.latencies_s.extend(lat)
                stats.points += pts
                stats.requests += reqs
                stats.offered_points += offered
                for name, n in errs.items():
                    stats.errors[name] = stats.errors.get(name, 0) + n

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration_s + 120)
    stats.seconds = time.monotonic() - start
    return stats


def run_writers(addr: str, database: str, batches: list, clients: int, duration_s: float,
                rate_points_per_s: float | None = None, points_per_batch: int = POINTS_PER_BATCH,
                stats: WriteStats | None = None,
                once: bool = False, cycle_base: int = 0) -> WriteStats:
    """`clients` threads, each with its own gRPC channel, write line-protocol batches for `duration_s`.

    Thread k sends batches[k::clients] cyclically, each cycle as new points
    (`distinct_cycle`: a sustained ingest of new data, not rewrites of the same
    points). With `rate_points_per_s` the threads pace themselves (open loop: a
    late request does not postpone later schedules beyond the catch-up) to that
    total rate. `once`: each batch is sent exactly once (thread k sends
    batches[k::clients]) and the run ends then. `cycle_base`: the first cycle's
    number (runs over the same batches with bases far apart write distinct points).
    """
    import grpc

    from iox_spark.server.api.client import IoxClient

    def connect(_k: int):
        c = IoxClient(addr)

        def send(body: bytes) -> dict:
            try:
                return c.write(database, body, timeout_s=60)
            except grpc.RpcError as e:
                raise SendFailed(e.code().name, 0.05 if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else 0.0)

        return send, c.close

    return run_paced(connect, batches, clients, duration_s, rate_points_per_s, points_per_batch,
                      stats if stats is not None else WriteStats(), once, cycle_base)


#: the topic of the raw-produce baselines: not iox.*, so the server's consumer never reads it
RAW_TOPIC = "bench.raw-write"


def raw_produce(bootstrap: str, batches: list, clients: int, duration_s: float, partitions: int,
                rate_points_per_s: float | None = None, points_per_batch: int = POINTS_PER_BATCH) -> WriteStats:
    """The baseline of our write path: confluent-kafka producing the same request bytes straight to
    the same broker, one message per request, with the server's producer configuration (idempotent,
    `acks=all`, linger: concurrent messages of a partition share a batch) and one producer for all
    `clients` threads, as the server has. The schedule is `run_writers`'s (same pacing, same
    `distinct_cycle` bodies); thread k's i-th request goes to partition (k + i) % partitions. A
    request's latency is produce() to its delivery report. Runs in the bench's process."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from iox_spark.server.write_buffer.producer import producer_conf

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    fut = admin.create_topics([NewTopic(RAW_TOPIC, partitions, 1)])[RAW_TOPIC]
    try:
        fut.result(15)
    except Exception:
        pass  # already exists
    producer = Producer(producer_conf(bootstrap, 10_000))
    stop = threading.Event()
    poller = threading.Thread(target=lambda: [producer.poll(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    poller.start()
    # warm-up: one message, so the producer id and metadata are in place before the clock starts
    producer.produce(RAW_TOPIC, value=b"warmup", partition=0)
    producer.flush(15)

    def connect(k: int):
        sent = [0]

        def send(body: bytes) -> dict:
            done = threading.Event()
            err: list = []

            def cb(e, _m):
                err.append(e)
                done.set()

            producer.produce(RAW_TOPIC, value=body, partition=(k + sent[0]) % partitions, on_delivery=cb)
            sent[0] += 1
            if not done.wait(30):
                raise SendFailed("TIMEOUT")
            if err[0] is not None:
                raise SendFailed(err[0].name())
            return {}

        return send, lambda: None

    try:
        return run_paced(connect, batches, clients, duration_s, rate_points_per_s, points_per_batch,
                          WriteStats(), False, 0)
    finally:
        stop.set()
        producer.flush(10)
