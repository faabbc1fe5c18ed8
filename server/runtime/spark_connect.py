"""Spark Connect's token: the server never serves Spark Connect without one.

Invariant: Spark Connect runs any code a client sends (Python UDFs, JVM calls, reads of host files)
as the server's user, so it listens only with a token. With `--auth-token` that token is Spark
Connect's; without it the server generates one at its first start and keeps it in
`<data-dir>/spark-connect.json` (with the port), a file only its owner may read (mode 0600),
reused at every later start on that data directory. `iox spark-connect-url --data-dir D` prints the
URL a PySpark client takes (`sc://localhost:PORT/;token=...`: PySpark sends a token without TLS
only to `localhost`); the `--auth-token` itself is never written there.

Called by `IoxServer.start` (driver) before the Spark application starts; the command line reads
the record. Nothing here runs on executors.
"""
from __future__ import annotations

import json
import os
import secrets

from iox_spark.server.errors import ServerError

__all__ = ["RECORD", "token_for", "connect_url", "NoSparkConnectRecord"]

#: the record in the data directory: {"port": P, "token": T}
RECORD = "spark-connect.json"


class NoSparkConnectRecord(ServerError):
    """No server with Spark Connect ever started on this data directory."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(f"no Spark Connect record at {path}: start `iox serve` on this data directory with Spark "
                         f"Connect on (--spark-connect-port, 15002 by default), or pass --data-dir")


def _path(data_dir: str) -> str:
    return os.path.join(data_dir, RECORD)


def _read(data_dir: str) -> dict | None:
    try:
        with open(_path(data_dir)) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) and isinstance(rec.get("token"), str) and rec["token"] else None
    except (OSError, ValueError):
        return None


def _write(data_dir: str, rec: dict) -> None:
    """Writes the record readable by its owner only (created 0600, never wider for a moment)."""
    path = _path(data_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, json.dumps(rec).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def token_for(data_dir: str, port: int, auth_token: str | None) -> str:
    """The token Spark Connect on `port` requires: `auth_token` when set (never written to disk:
    the record then says so), else the one this data directory keeps (generated the first time).
    Records the port for `connect_url`."""
    generated = (_read(data_dir) or {}).get("token") or secrets.token_urlsafe(32)
    os.makedirs(data_dir, exist_ok=True)
    _write(data_dir, {"port": port, "token": generated, "uses_auth_token": bool(auth_token)})
    return auth_token or generated


def connect_url(data_dir: str) -> str:
    """`sc://localhost:PORT/;token=TOKEN` of the server on `data_dir`; NoSparkConnectRecord without one."""
    rec = _read(data_dir)
    if rec is None or not isinstance(rec.get("port"), int):
        raise NoSparkConnectRecord(_path(data_dir))
    token = "<the server's --auth-token>" if rec.get("uses_auth_token") else rec["token"]
    return f"sc://localhost:{rec['port']}/;token={token}"
