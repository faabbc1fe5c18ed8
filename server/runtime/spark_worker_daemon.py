"""PySpark's Python worker daemon, with each worker's socket to the JVM answering at once.

Spark starts Python workers through a daemon (`spark.python.daemon.module`, by default
`pyspark.daemon`): the JVM connects to it over TCP on the loopback, and it forks a worker per
connection. Neither end sets TCP_NODELAY, so every `mapInArrow` (a chunk's view, compaction,
persist, the Kafka source's reads) paid Nagle's algorithm against delayed ACKs: the JVM sends
the task's command and then the Arrow stream's first message, the second is held until the
worker's kernel ACKs the first, and that ACK waits for the delayed-ACK timer (40 ms on Linux).
Measured on this machine (Spark 4.3, local[2], one `mapInArrow` over 20 rows, 8 runs): the
worker waited 38-46 ms for its first batch in every run, and the job took 85-131 ms; with
this daemon 0-5 ms and 58-84 ms. A union of four such reads in one task took 256-273 ms
against 85-123 ms.

This module is `pyspark.daemon` itself with two changes to the sockets of the workers it
forks, and nothing else:
- the worker's reads first set TCP_QUICKACK, so the ACK of what the JVM sent goes out before
  the worker waits for more (the kernel leaves quick-ACK mode on its own, hence each read);
- TCP_NODELAY on the worker's socket, so its own small writes are not held either.

Invariant: the bytes a worker reads and writes, and everything else the daemon does, are
`pyspark.daemon`'s. A socket that refuses an option (a Unix domain socket, with
`spark.python.unix.domain.socket.enabled`) is used as it is.

Runs as the daemon process Spark starts (`python -m iox_spark.server.runtime.spark_worker_daemon`, set by
server/runtime/spark.py `build_spark`; `--spark-conf spark.python.daemon.module=pyspark.daemon` turns
it off), and in the workers it forks. Imports only the standard library and pyspark before
the fork: the daemon must start no thread.
"""
from __future__ import annotations

import io
import os
import socket
import stat

__all__ = ["QuickAckReader", "MODULE"]

#: the value of spark.python.daemon.module that selects this daemon
MODULE = "iox_spark.server.runtime.spark_worker_daemon"


class QuickAckReader(io.RawIOBase):
    """Raw reads of a socket's file descriptor `fd` (owned: closed with the reader), each after
    setting TCP_QUICKACK, which sends an ACK the kernel holds back at once. Worker side."""

    def __init__(self, fd: int):
        super().__init__()
        self._fd = fd
        # a socket object on a copy of the descriptor, to set options; reads go to `fd`
        self._sock = socket.socket(fileno=os.dup(fd))
        self._quickack = hasattr(socket, "TCP_QUICKACK") and self._sock.family in (socket.AF_INET, socket.AF_INET6)

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, b) -> int:
        if self._quickack:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            except OSError:
                self._quickack = False
        return os.readv(self._fd, [b])

    def close(self) -> None:
        if not self.closed:
            try:
                self._sock.close()
            finally:
                os.close(self._fd)
        super().close()


def _is_tcp_socket(fd: int) -> bool:
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        return False
    s = socket.socket(fileno=os.dup(fd))
    try:
        return s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM
    finally:
        s.close()


class _DaemonOs:
    """`os` as pyspark.daemon sees it: the same, except that a TCP socket opened for reading
    (a worker's input from the JVM) reads through a QuickAckReader."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def fdopen(fd, mode="r", buffering=-1, *args, **kwargs):
        if mode == "rb" and not args and not kwargs and _is_tcp_socket(fd):
            return io.BufferedReader(QuickAckReader(fd), buffering if buffering > 0 else io.DEFAULT_BUFFER_SIZE)
        return os.fdopen(fd, mode, buffering, *args, **kwargs)


def _install(daemon) -> None:
    """Points `daemon` (the pyspark.daemon module) at the socket changes above."""
    serve = daemon.worker

    def worker(sock, authenticated):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not a TCP socket
        return serve(sock, authenticated)

    daemon.worker = worker
    daemon.os = _DaemonOs()


if __name__ == "__main__":
    import pyspark.daemon as _daemon

    _install(_daemon)
    _daemon.manager()
