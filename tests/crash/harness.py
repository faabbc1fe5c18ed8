"""Crash harness: runs `iox serve` as a real subprocess (embedded broker, own data dir),
writes uniquely identifiable points through gRPC, records which writes were acknowledged,
and checks after a restart that the query results are exactly the acknowledged writes.

A write whose acknowledgement was lost in the crash may or may not be in Kafka; it is
allowed to appear (at most once) but never required. Acknowledged writes must all appear,
exactly once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import grpc

from iox_spark.catalog.crash_points import ENV as CRASH_ENV, CrashPoint
from iox_spark.server.runtime.broker import free_port, process_alive, remove_left_sockets
from iox_spark.server.api.client import IoxClient
from tests.waiting import accepts_connections
from tests.timestamps import T0

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IOX = os.path.join(os.path.dirname(sys.executable), "iox")


#: Spark property of the servers these tests start (see ServerProcess._spawn)
_SHORT_LIVED_JVM = "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1"


def _memory_broker_unless_asked(extra: list) -> list:
    """The in-memory embedded broker unless `extra` chooses a storage or a Kafka cluster: a
    durable broker's store costs each test seconds per start. The durable default has tests of
    its own (tests/integration/write_buffer/test_durable_broker.py and the durable crash tests), which ask for it."""
    if any(a.startswith(("--broker-storage", "--kafka-bootstrap")) for a in extra):
        return []
    return ["--broker-storage", "memory"]


#: pause between two probes of a starting server's gRPC port
_LISTEN_POLL_S = 0.05


class ServerProcess:
    def __init__(self, data_dir: str, crash_at: CrashPoint | None = None, extra: list | None = None,
                 env: dict | None = None, port: int | None = None):
        """`extra`: more `iox serve` arguments; `env`: more environment variables of the server;
        `port`: its gRPC port (default: a free one; a pool member restarted on its port keeps
        the address the assigner knows it by)."""
        self.data_dir = data_dir
        self._crash_at = CrashPoint(crash_at) if crash_at else None
        #: the crash point it is armed at (None: none)
        self.crash_at = self._crash_at
        self._extra = extra
        self._env = dict(env or {})
        self._port = port
        self._spawn()

    def _spawn(self) -> None:
        data_dir, crash_at, extra = self.data_dir, self._crash_at, self._extra
        self.port = self._port or free_port()
        env = dict(os.environ)
        env.pop(CRASH_ENV, None)
        env.update(self._env)
        # a test server lives ~30 s: its JVM compiles with C1 only (no C2 compiler threads
        # competing for the 2 cores); tests/crash took 390 s instead of 504 s in one run each
        env.setdefault("IOX_SPARK_CONF", _SHORT_LIVED_JVM)
        if crash_at:
            env[CRASH_ENV] = crash_at.value
        self.log_path = os.path.join(data_dir, f"server-{self.port}.log")
        os.makedirs(data_dir, exist_ok=True)
        args = [IOX, "serve", "--data-dir", data_dir, "--grpc-port", str(self.port), "--http-port", "0",
                "--spark-connect-port", "0", "--driver-memory", "2g", "--partitions", "2",
                "--produce-timeout-ms", "5000"] + _memory_broker_unless_asked(extra or []) + (extra or [])
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.client = IoxClient(f"127.0.0.1:{self.port}")

    def wait_ready(self, timeout_s: float = 180.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout_s
        retries = 2
        while True:
            if self.proc.poll() is not None:
                if retries and self._port is None and "Address already in use" in self.tail(200_000):
                    # the free port was taken by another process (e.g. Spark) before gRPC bound it
                    retries -= 1
                    self.client.close()
                    self._spawn()
                    continue
                raise AssertionError(f"server exited with {self.proc.returncode}: {self.tail()}")
            # the client's first call only once the port accepts connections (see accepts_connections)
            if accepts_connections(self.port):
                try:
                    self.client.wait_ready(2)
                    return self
                except TimeoutError:
                    pass
            else:
                time.sleep(_LISTEN_POLL_S)
            assert time.monotonic() < deadline, f"server not ready: {self.tail()}"

    def tail(self, n: int = 4000) -> str:
        try:
            return open(self.log_path, "rb").read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.client.close()

    def terminate(self, timeout_s: float = 180.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        self.client.close()
        return rc

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None


def broker_record(data_dir: str) -> dict:
    with open(os.path.join(data_dir, "broker.json")) as f:
        return json.load(f)


def stored_offsets(data_dir: str, topic: str, kp: int) -> list[int]:
    """Base offsets of the record batches the durable embedded broker's store holds for one
    partition, in order (listed with boto3 as Tansu lays them out)."""
    from iox_spark.server.runtime.broker import STORE_BUCKET, TANSU_CLUSTER_ID, store_client
    from iox_spark.server.runtime.broker_truncation import batch_offset, partition_prefix

    pages = store_client(broker_record(data_dir)["store_port"]).get_paginator("list_objects_v2").paginate(
        Bucket=STORE_BUCKET, Prefix=partition_prefix(TANSU_CLUSTER_ID, topic, kp))
    return sorted(o for page in pages for o in (batch_offset(c["Key"]) for c in page.get("Contents", ()))
                  if o is not None)


def stop_embedded_broker(data_dir: str) -> None:
    """SIGKILLs the embedded broker recorded in `data_dir` and, for a durable one, its store, and
    removes the unix sockets the store leaves in /tmp once it is gone."""
    try:
        rec = broker_record(data_dir)
    except (OSError, ValueError):
        return
    pids = [pid for pid in (rec.get("pid"), rec.get("store_pid")) if pid]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if rec.get("store_dir"):
        deadline = time.monotonic() + 10
        while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        remove_left_sockets(rec["store_dir"])


#: pause between the batches of Writer.write_until_dead: writers that never pause kept both cores busy
#: (~600 requests a second), so the crash points that wait for persists came late, and the check
#: after the restart replayed ~700k rows
WRITE_PAUSE_S = 0.01


class Writer:
    """Writes batches of uniquely numbered points; remembers what was acknowledged."""

    def __init__(self, db: str, table: str = "crash"):
        self.db = db
        self.table = table
        self.next_id = 0
        self.acked: set = set()
        self.unacked: set = set()
        self.tokens: list = []

    def write_batch(self, client: IoxClient, n: int = 50) -> bool:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        lp = "\n".join(f"{self.table},src=w{i % 4} id={i}i {T0 + i * 1000}" for i in ids)
        try:
            tok = client.write(self.db, lp, timeout_s=10)
        except (grpc.RpcError, ValueError):  # ValueError: the client was closed meanwhile (its server killed)
            self.unacked.update(ids)
            return False
        self.acked.update(ids)
        self.tokens.append(tok)
        return True

    def write_until_dead(self, server: ServerProcess, timeout_s: float = 120.0, n: int = 50,
                         pause_s: float = WRITE_PAUSE_S) -> None:
        """Writes batches of `n` points, `pause_s` apart, until the server died (at its crash point)."""
        deadline = time.monotonic() + timeout_s
        while server.proc.poll() is None:
            assert time.monotonic() < deadline, f"the crash point never fired: {server.tail()}"
            self.write_batch(server.client, n)
            time.sleep(pause_s)
        server.client.close()

    def check(self, client: IoxClient, timeout_s: float = 180.0, wait_tokens: bool = True) -> list:
        """Waits until every acknowledged write is applied, then checks exactly-once, and that `iox
        verify` finds the answers equal to the write buffer.

        wait_tokens=False after a write-buffer reset: the old tokens' offsets belong to
        the previous epoch (everything of it was persisted)."""
        merged: dict = {}
        for tok in self.tokens:
            for p, off in tok.items():
                merged[p] = max(merged.get(p, -1), off)
        if wait_tokens:
            client.wait_applied(self.db, merged, timeout_s=timeout_s)
        rows = client.query(self.db, f"SELECT id FROM {self.table}").to_pylist()
        ids = [r["id"] for r in rows]
        assert len(ids) == len(set(ids)), f"duplicates: {len(ids) - len(set(ids))}"
        got = set(ids)
        missing = self.acked - got
        assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:10]}"
        extra = got - self.acked - self.unacked
        assert not extra, f"rows nobody wrote: {sorted(extra)[:10]}"
        report = client.verify(self.db, table=self.table, timeout_s=timeout_s)  # the server's own check agrees
        assert report["ok"], f"iox verify: {report}"
        return ids
