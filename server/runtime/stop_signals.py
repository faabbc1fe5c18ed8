"""The process signals `iox serve` answers: SIGTERM and SIGINT stop the server, SIGHUP re-reads its tokens.

Invariant: a SIGTERM or SIGINT never kills the server with the signal's default death. It only
sets `requested`; the thread blocked in `wait_for_stop` (the main thread of `iox serve`) calls the
stop, also when the signal came while the server was still starting (its stop then runs once the
start returned). SIGHUP runs `on_hup` in a thread of its own (a handler must not block).

When it runs: `install` from the main thread (Python delivers signals there), before the server
starts; `wait_for_stop` blocks until the stop ran.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Callable

__all__ = ["StopSignals"]

log = logging.getLogger(__name__)

#: how often `wait_for_stop` looks whether the server stopped by other means (a failed start)
_POLL_S = 0.5


class StopSignals:
    """SIGTERM / SIGINT set `requested`; SIGHUP calls `on_hup` in a new thread."""

    def __init__(self, on_hup: Callable[[], object]):
        self._on_hup = on_hup
        self.requested = threading.Event()

    def install(self) -> None:
        """Installs the handlers (main thread only)."""
        def _on_stop(signum, _frame):
            log.info("signal %s: shutting down", signum)
            self.requested.set()

        def _on_hup(_signum, _frame):
            threading.Thread(target=self._on_hup, name="reload-tokens").start()

        signal.signal(signal.SIGTERM, _on_stop)
        signal.signal(signal.SIGINT, _on_stop)
        signal.signal(signal.SIGHUP, _on_hup)

    def wait_for_stop(self, stopped: threading.Event, stop: Callable[[], None]) -> None:
        """Blocks until `stopped` is set; calls `stop` once a stop was requested."""
        while not stopped.is_set():
            if self.requested.wait(_POLL_S):
                stop()
