"""InfluxDB 3's one port: HTTP/1.1 and gRPC on a single port, told apart by each connection's first
bytes, so that an InfluxDB 3 client given one address (`InfluxDBClient3(host="http://H:8181")`)
writes over HTTP and queries over Flight without a second port.

Invariant: every byte of a connection reaches the one server it was meant for, unchanged and in
order: a connection that opens with HTTP/2's preface (`PRI * HTTP/2.0`, what gRPC sends) is joined
to the gRPC port, any other to the HTTP port, on loopback; each direction is copied until its
side closes, and then the other side is closed for writing. The servers behind it apply their own
limits, tokens and errors; this adds none and reads nothing beyond the first bytes. A connection
that sends nothing within FIRST_BYTES_TIMEOUT_S is closed.

When it runs: started by the server (`--influxdb3-port`, 0: off) after gRPC and HTTP are serving,
in a daemon thread running its own asyncio loop; stopped by `IoxServer.stop()` before them.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading

__all__ = ["OnePortServer", "GRPC_PREFACE", "FIRST_BYTES_TIMEOUT_S"]

log = logging.getLogger(__name__)

#: how an HTTP/2 connection with prior knowledge (gRPC) starts (RFC 9113, 3.4)
GRPC_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: a connection silent this long before its first bytes is closed
FIRST_BYTES_TIMEOUT_S = 30.0
_CHUNK = 256 * 1024


class OnePortServer:
    """Listens on (`host`, `port`) and joins each connection to `grpc_port` or `http_port` on
    `target_host` (loopback by default). `start` raises OSError when the port cannot be bound."""

    def __init__(self, host: str, port: int, grpc_port: int, http_port: int, target_host: str = "127.0.0.1"):
        self.host, self.port = host, port
        self.grpc_port, self.http_port, self.target_host = grpc_port, http_port, target_host
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    def start(self) -> "OnePortServer":
        loop = asyncio.new_event_loop()
        family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            loop.close()
            raise
        self.port = sock.getsockname()[1]
        self._server = loop.run_until_complete(asyncio.start_server(self._serve, sock=sock))
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="influxdb3-port", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._loop = None

        async def close():
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # connections cut: not an error

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        try:
            first = await asyncio.wait_for(self._first_bytes(reader), FIRST_BYTES_TIMEOUT_S)
            if not first:
                return
            port = self.grpc_port if first.startswith(GRPC_PREFACE[:4]) else self.http_port
            up_reader, upstream = await asyncio.open_connection(self.target_host, port)
            upstream.write(first)
            await asyncio.gather(_pump(reader, upstream), _pump(up_reader, writer))
        except (asyncio.TimeoutError, ConnectionError, OSError) as e:
            log.debug("influxdb3 port: connection ended (%s)", e)
        except asyncio.CancelledError:  # the server stops
            pass
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.close()

    @staticmethod
    async def _first_bytes(reader: asyncio.StreamReader) -> bytes:
        """The connection's first bytes, enough to tell HTTP/2's preface from an HTTP/1.1 request
        line (4: "PRI " or a method), or what came before it closed."""
        data = b""
        while len(data) < 4:
            chunk = await reader.read(_CHUNK)
            if not chunk:
                break
            data += chunk
        return data


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies `reader` to `writer` until `reader` ends, then ends `writer`'s direction."""
    try:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass
