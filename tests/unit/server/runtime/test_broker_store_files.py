"""Where the durable broker's store (SeaweedFS, server/runtime/broker.py) keeps its log files and unix
sockets, and which sockets its stop removes: its own, once nothing listens on them, and nothing else."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from iox_spark.server.runtime import broker

PORTS = {"master": 11001, "volume": 11002, "filer": 11003, "admin": 11004, "s3": 11005}


@pytest.fixture
def short_dir():
    """A directory with a short path: a unix socket's path must fit in 104 bytes."""
    d = tempfile.mkdtemp(prefix="iox-sock-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _command(monkeypatch, store_dir: str) -> list[str]:
    monkeypatch.setattr(broker, "object_server_binary", lambda: "weed")
    return broker._store_command(store_dir, PORTS)


def _flag(cmd: list[str], name: str) -> str:
    (value,) = [c.split("=", 1)[1] for c in cmd if c.startswith(f"{name}=")]
    return value


def test_the_store_logs_in_its_directory_and_keeps_its_local_sockets_beside_it(monkeypatch, tmp_path):
    store_dir = str(tmp_path / "broker-store")
    cmd = _command(monkeypatch, store_dir)
    # glog's directory is an option of `weed` itself, before the subcommand
    assert cmd[:3] == ["weed", f"-logdir={os.path.join(store_dir, 'log')}", "mini"]
    assert _flag(cmd, "-filer.localSocket") == _flag(cmd, "-s3.localFilerSocket") == f"{store_dir}-sockets/filer.sock"
    assert _flag(cmd, "-s3.localSocket") == f"{store_dir}-sockets/s3.sock"
    for name, port in PORTS.items():
        assert _flag(cmd, f"-{name}.port") == str(port)
        assert _flag(cmd, f"-{name}.port.grpc") == str(port + broker._GRPC_PORT_OFFSET)


def test_a_relative_store_directory_gets_absolute_socket_paths(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cmd = _command(monkeypatch, "broker-store")
    assert _flag(cmd, "-dir") == "broker-store"
    assert _flag(cmd, "-s3.localSocket") == f"{tmp_path}/broker-store-sockets/s3.sock"


def test_a_socket_path_too_long_for_a_unix_socket_is_seaweedfs_default_in_tmp(monkeypatch, tmp_path):
    """Each socket on its own: `<dir>-sockets/filer.sock` 104 bytes long does not fit,
    `<dir>-sockets/s3.sock` (101) does. The default is named explicitly (`weed mini` would take an
    earlier start's path from mini.options)."""
    tail = len("-sockets/filer.sock")
    store_dir = str(tmp_path / ("x" * (broker._UNIX_SOCKET_PATH_MAX - len(str(tmp_path)) - tail - 1)))
    assert len(f"{store_dir}-sockets/filer.sock") == broker._UNIX_SOCKET_PATH_MAX
    cmd = _command(monkeypatch, store_dir)
    assert _flag(cmd, "-filer.localSocket") == _flag(cmd, "-s3.localFilerSocket") == \
        "/tmp/seaweedfs-filer-11003.sock"
    assert _flag(cmd, "-s3.localSocket") == f"{store_dir}-sockets/s3.sock"
    assert _flag(cmd, "-logdir") == f"{store_dir}/log"  # a log file's path has no such limit

    fits = store_dir[:-1]  # 103 bytes: fits
    assert _flag(_command(monkeypatch, fits), "-filer.localSocket") == f"{fits}-sockets/filer.sock"


def test_the_sockets_of_a_store_are_its_local_ones_and_one_per_grpc_port():
    assert broker._weed_socket("master-grpc", 21001) == "/tmp/seaweedfs-master-grpc-21001.sock"
    assert broker._weed_socket("s3", 11005) == "/tmp/seaweedfs-s3-11005.sock"
    assert broker._store_sockets("/data/broker-store", PORTS) == [
        "/data/broker-store-sockets/filer.sock", "/data/broker-store-sockets/s3.sock",
        "/tmp/seaweedfs-master-grpc-21001.sock", "/tmp/seaweedfs-volume-grpc-21002.sock",
        "/tmp/seaweedfs-filer-grpc-21003.sock", "/tmp/seaweedfs-admin-grpc-21004.sock",
        "/tmp/seaweedfs-s3-grpc-21005.sock"]


def test_the_stores_ports_keep_s3s_and_never_share_one():
    ports = broker._store_ports(12345)
    assert list(ports) == list(broker._STORE_COMPONENTS) and ports["s3"] == 12345
    every = [p + off for p in ports.values() for off in (0, broker._GRPC_PORT_OFFSET)]
    assert len(set(every)) == len(every)


def _stale_socket(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)  # closed without unlinking: what a killed process leaves


def test_a_stop_removes_only_its_own_sockets_and_only_those_nothing_listens_on(monkeypatch, short_dir):
    tmp = os.path.join(short_dir, "tmp")
    store_dir = os.path.join(short_dir, "store")
    os.makedirs(tmp)
    os.makedirs(store_dir)
    os.makedirs(broker._sockets_dir(store_dir))
    monkeypatch.setattr(broker, "_WEED_SOCKET_DIR", tmp)
    mine = broker._store_sockets(store_dir, PORTS)
    for path in mine:
        _stale_socket(path)
    others = [os.path.join(tmp, "seaweedfs-master-grpc-21009.sock"), os.path.join(tmp, "seaweedfs-s3-11006.sock")]
    for path in others:  # another store's, on other ports
        _stale_socket(path)
    not_a_socket = broker._weed_socket("volume-grpc", PORTS["volume"] + broker._GRPC_PORT_OFFSET)
    os.unlink(not_a_socket)
    with open(not_a_socket, "w"):
        pass
    served = socket.socket(socket.AF_UNIX)
    live = broker._weed_socket("filer-grpc", PORTS["filer"] + broker._GRPC_PORT_OFFSET)
    os.unlink(live)
    served.bind(live)
    served.listen()
    broker._record_store_ports(store_dir, PORTS)
    assert broker._recorded_store_ports(store_dir) == PORTS
    try:
        broker.remove_left_sockets(store_dir)
        assert sorted(p for p in mine if os.path.exists(p)) == sorted([not_a_socket, live])
        assert all(os.path.exists(p) for p in others)
        assert broker._recorded_store_ports(store_dir) == PORTS  # kept while one of them is served
    finally:
        served.close()
    broker.remove_left_sockets(store_dir)
    assert [p for p in mine if os.path.exists(p)] == [not_a_socket]
    assert all(os.path.exists(p) for p in others)
    assert not os.path.exists(broker._sockets_dir(store_dir))  # the record, and the directory once empty
    broker.remove_left_sockets(store_dir)  # no record: nothing to do


def test_a_ports_record_that_is_not_one_removes_nothing(monkeypatch, short_dir):
    monkeypatch.setattr(broker, "_WEED_SOCKET_DIR", short_dir)
    path = broker._weed_socket("master-grpc", PORTS["master"] + broker._GRPC_PORT_OFFSET)
    _stale_socket(path)
    for text in ("{", "[]", '{"master": 11001}', '{"master": "11001", "volume": 1, "filer": 1, "admin": 1, "s3": 1}'):
        os.makedirs(broker._sockets_dir(short_dir), exist_ok=True)
        with open(os.path.join(broker._sockets_dir(short_dir), broker._STORE_PORTS_RECORD), "w") as f:
            f.write(text)
        assert broker._recorded_store_ports(short_dir) is None
        broker.remove_left_sockets(short_dir)
        assert os.path.exists(path)
    assert not os.path.exists(os.path.join(broker._sockets_dir(short_dir), broker._STORE_PORTS_RECORD))


def test_a_process_whose_main_thread_exited_is_alive_until_its_last_thread_does():
    """A Go program's main thread becomes a zombie before its other threads exit, and those still hold
    its sockets: a stop that took it for gone found the store's sockets still served."""
    # its other thread lives until the test closes its stdin: the process cannot end before it is looked at
    child = subprocess.Popen([sys.executable, "-c",
                              "import ctypes, sys, threading\n"
                              "threading.Thread(target=sys.stdin.read).start()\n"
                              "ctypes.CDLL(None).pthread_exit(None)\n"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(") ", 1)[1][0] == "Z":
                    break
            assert time.monotonic() < deadline, "the child's main thread did not exit"
            time.sleep(0.02)
        assert child.poll() is None
        assert broker.process_alive(child.pid)
        child.stdin.close()
        child.wait(10)
        assert not broker.process_alive(child.pid)
    finally:
        child.kill()
        child.wait()
