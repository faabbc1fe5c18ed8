"""A real Spark standalone cluster on 127.0.0.1 for integration tests: one master, one worker.

Invariant kept here: while the module fixture :func:`spark_cluster` is active, a
master and a worker run in JVMs of their own (started from the pyspark
installation's `bin/spark-class`), the worker is registered with the master, and
the worker starts each application's executor as a separate JVM (a child of the
worker process), which a test may SIGKILL (:meth:`SparkCluster.executor_pids`);
the worker then starts a new one. A cluster that does not come up fails the
test loudly (never skips). At the end the worker and the master are stopped
with their process groups (their executors with them).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

import pytest

from iox_spark.server.runtime.broker import free_port

__all__ = ["SparkCluster", "spark_cluster", "CLUSTER_START_TIMEOUT_S", "WORKER_CORES"]

#: seconds for the master to answer and the worker to register
CLUSTER_START_TIMEOUT_S = 90.0
#: task slots the worker offers (the machine's cores are shared with the test and the broker)
WORKER_CORES = 2
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass
class SparkCluster:
    master_url: str
    webui_port: int
    dir: str
    procs: list = field(default_factory=list)

    @property
    def worker_pid(self) -> int:
        return self.procs[1].pid

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def executor_pids(self) -> list:
        """The executor JVMs the worker runs now (its child processes running the executor backend)."""
        out = []
        for pid in _children(self.worker_pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if _EXECUTOR_CLASS.encode() in f.read():
                        out.append(pid)
            except OSError:
                pass
        return sorted(out)

    def log_tail(self, n: int = 3000) -> str:
        out = []
        for name in ("master.log", "worker.log"):
            try:
                out.append(f"--- {name}\n" + open(os.path.join(self.dir, name), errors="replace").read()[-n:])
            except OSError:
                pass
        return "\n".join(out)


def _children(pid: int) -> list:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _start(args: list, log_path: str, env: dict) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([os.path.join(spark_home(), "bin", "spark-class")] + args, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    finally:
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, the process group `proc` leads (the JVM and what it started)."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def start_cluster(base_dir: str, cores: int = WORKER_CORES) -> SparkCluster:
    """Starts a master and a worker; returns once the worker is registered (or fails the test)."""
    env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=os.path.join(base_dir, "logs"), SPARK_NO_DAEMONIZE="1")
    port, webui = free_port(), free_port()
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", webui, base_dir)
    cluster.procs.append(_start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                                 "--webui-port", str(webui)], os.path.join(base_dir, "master.log"), env))
    deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
    started_worker = False
    while True:
        if any(p.poll() is not None for p in cluster.procs):
            stop_cluster(cluster)
            pytest.fail(f"the Spark standalone cluster exited while starting:\n{cluster.log_tail()}")
        try:
            state = cluster.state()
        except (OSError, ValueError):  # not listening yet, or an empty answer while its web UI starts
            state = None
        if state is not None and not started_worker:
            work = os.path.join(base_dir, "work")
            os.makedirs(work, exist_ok=True)
            cluster.procs.append(_start(["org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host",
                                         "127.0.0.1", "--cores", str(cores), "--memory", "2g", "--webui-port",
                                         str(free_port()), "--work-dir", work],
                                        os.path.join(base_dir, "worker.log"), env))
            started_worker = True
        if state is not None and state.get("aliveworkers", 0) >= 1:
            return cluster
        if time.monotonic() > deadline:
            stop_cluster(cluster)
            pytest.fail(f"no Spark worker registered within {CLUSTER_START_TIMEOUT_S} s:\n{cluster.log_tail()}")
        time.sleep(0.2)


def stop_cluster(cluster: SparkCluster) -> None:
    for p in reversed(cluster.procs):
        _stop(p)


@pytest.fixture(scope="module")
def spark_cluster():
    """A running standalone master + worker for the module's tests."""
    base = tempfile.mkdtemp(prefix="iox-spark-cluster-")
    cluster = start_cluster(base)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
        shutil.rmtree(base, ignore_errors=True)
