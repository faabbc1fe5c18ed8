"""server/runtime/spark_worker_daemon.py: the worker's reads through QuickAckReader return exactly the
bytes sent, on TCP and on Unix domain sockets; the daemon's `os` wraps only TCP sockets opened
for reading; the installed worker sets TCP_NODELAY and then serves as pyspark's does."""
from __future__ import annotations

import io
import os
import socket
import threading
import types

import pytest

from iox_spark.server.runtime import spark_worker_daemon as swd


def _tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    return a, b


def _send_in_pieces(sock, pieces):
    def run():
        for p in pieces:
            sock.sendall(p)
        sock.shutdown(socket.SHUT_WR)

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_reads_return_exactly_the_bytes_sent_then_eof(kind):
    a, b = _tcp_pair() if kind == "tcp" else socket.socketpair()
    pieces = [b"x" * 7, os.urandom(200_000), b"", b"tail"]
    t = _send_in_pieces(a, pieces)
    f = io.BufferedReader(swd.QuickAckReader(os.dup(b.fileno())), 65536)
    got = f.read(7) + f.read()
    t.join(10)
    assert got == b"".join(pieces)
    assert f.read() == b""
    f.close()
    a.close()
    b.close()


def test_quickack_is_set_only_on_tcp():
    a, b = _tcp_pair()
    u1, u2 = socket.socketpair()
    tcp, unix = swd.QuickAckReader(os.dup(b.fileno())), swd.QuickAckReader(os.dup(u2.fileno()))
    assert tcp._quickack is True
    assert unix._quickack is False
    for s in (tcp, unix, a, b, u1, u2):
        s.close()


def test_close_closes_the_descriptor_it_owns():
    a, b = _tcp_pair()
    fd = os.dup(b.fileno())
    r = swd.QuickAckReader(fd)
    r.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    r.close()  # twice is fine
    a.close()
    b.close()


def test_daemon_os_wraps_only_a_tcp_socket_opened_for_reading():
    a, b = _tcp_pair()
    rfd, wfd = os.pipe()
    dos = swd._DaemonOs()
    sock_in = dos.fdopen(os.dup(b.fileno()), "rb", 4096)
    sock_out = dos.fdopen(os.dup(b.fileno()), "wb", 4096)
    pipe_in = dos.fdopen(rfd, "rb", 4)
    assert isinstance(sock_in, io.BufferedReader) and isinstance(sock_in.raw, swd.QuickAckReader)
    assert not isinstance(getattr(sock_out, "raw", None), swd.QuickAckReader)
    assert isinstance(pipe_in.raw, io.FileIO)
    assert dos.getpid() == os.getpid()  # everything else is os's
    sock_out.write(b"ping")
    sock_out.flush()
    assert a.recv(4) == b"ping"
    for f in (sock_in, sock_out, pipe_in):
        f.close()
    os.close(wfd)
    a.close()
    b.close()


def test_installed_worker_sets_nodelay_then_serves_as_pyspark_does():
    a, b = _tcp_pair()
    calls = []

    def serve(sock, authenticated):
        nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) if sock.family == socket.AF_INET else None
        calls.append((nodelay, authenticated))
        return 0

    fake = types.SimpleNamespace(worker=serve, os=os)
    swd._install(fake)
    assert fake.os is not os and isinstance(fake.os, swd._DaemonOs)
    assert b.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    assert fake.worker(b, True) == 0
    assert calls == [(1, True)]
    u1, u2 = socket.socketpair()
    assert fake.worker(u2, False) == 0  # a Unix socket refuses the option: served all the same
    assert calls[-1] == (None, False)
    for s in (a, b, u1, u2):
        s.close()
