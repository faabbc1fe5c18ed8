"""Waiting on a condition in tests: poll until it holds or a deadline passes (then fail).

Tests wait for outcomes this way, never with a bare sleep; the poll interval only paces the
checks. Used by the integration tests; pure Python, no fixture.
"""
from __future__ import annotations

import logging
import socket
import time

__all__ = ["wait_for", "accepts_connections"]


_log = logging.getLogger(__name__)
#: a wait longer than this is logged (pytest --log-cli-level=INFO shows where a slow test waits)
_LOG_AFTER_S = 2.0


def wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.1):
    """Calls `cond()` every `poll_s` seconds until it returns a truthy value, which it returns;
    fails the test (AssertionError naming `what`) once `timeout_s` seconds passed without one."""
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        v = cond()
        if v:
            if time.monotonic() - start > _LOG_AFTER_S:
                _log.info("waited %.1f s for %s", time.monotonic() - start, what)
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(poll_s)


def accepts_connections(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on `host`:`port` (a TCP connect, closed at once).

    A gRPC client waiting for a starting server calls this before its first call: a call made
    before the server listens fails and puts the client's channel in gRPC's reconnect backoff
    (1 s, then 1.6 times longer each time), so the channel would find the server only up to
    several seconds after it started listening."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
