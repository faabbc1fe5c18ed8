"""Whether the ports a server is configured to listen on are free, before it starts anything.

Invariant: a port another process holds stops `iox serve` at once with one line naming the port
and the option that sets it (`PortTaken`), instead of a traceback from deep inside the gRPC server,
the HTTP server or Spark Connect's JVM. The probe binds each port the way the servers will (the
bind address, SO_REUSEADDR as both the gRPC and the HTTP server set it) and lets it go at once:
another process may still take it in between, and then the server's own bind fails as before.

Called once by `IoxServer.start` (driver), before the broker and Spark start.
"""
from __future__ import annotations

import errno
import socket

from iox_spark.server.errors import ServerError

__all__ = ["PortTaken", "check_ports_free"]


class PortTaken(ServerError):
    """A configured port is in use by another process."""

    def __init__(self, host: str, port: int, option: str, reason: str):
        self.host = host
        self.port = port
        self.option = option
        self.reason = reason
        super().__init__(f"port {port} on {host} is taken ({reason}): another process listens on it; stop it, or "
                         f"choose another port with {option} (0 turns it off where the option allows)")


def check_ports_free(host: str, ports: list) -> None:
    """Raises PortTaken for the first (port, option) of `ports` (0: not listening, skipped) that
    cannot be bound on `host`."""
    for port, option in ports:
        if not port:
            continue
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host.strip("[]"), port))
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise PortTaken(host, port, option, e.strerror or str(e)) from e
                raise
