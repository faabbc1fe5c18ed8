"""Waiting on a condition in tests: poll until it holds or a deadline passes (then fail).

Tests wait for outcomes this way, never with a bare sleep; the poll interval only paces the
checks. Used by the integration tests; pure Python, no fixture.
"""
from __future__ import annotations

import time

__all__ = ["wait_for"]


def wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.1):
    """Calls `cond()` every `poll_s` seconds until it returns a truthy value, which it returns;
    fails the test (AssertionError naming `what`) once `timeout_s` seconds passed without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(poll_s)
