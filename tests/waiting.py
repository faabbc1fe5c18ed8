"""Waiting on a condition in tests: poll until it holds or a deadline passes (then fail).

Tests wait for outcomes this way, never with a bare sleep; the poll interval only paces the
checks. Used by the integration tests; pure Python, no fixture.
"""
from __future__ import annotations

import logging
import time

__all__ = ["wait_for"]


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
