"""The embedded broker's supervisor: a broker (or its store) that died is started again by itself.

Invariant: while the server runs, an embedded broker that is gone is started again on the same
port and the same data directory, so writes recover without an operator; a durable broker then
serves every message it had acknowledged (an in-memory one has lost them: the server's start
warned). A server that is stopping stops its broker on purpose: the supervisor never restarts it
then (it acts only while it holds the server's stop lock, and the server is not stopped).

When it runs: a daemon thread from `start` (the server's start, with an embedded broker) until the
server's `stopped` event is set; it checks every `BROKER_CHECK_INTERVAL_S`. A failed start is
logged and retried on the next check. Driver only.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from iox_spark.server.runtime import broker as broker_mod

__all__ = ["BrokerSupervisor", "BROKER_CHECK_INTERVAL_S"]

#: How often the supervisor checks that the embedded broker still runs
BROKER_CHECK_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


class BrokerSupervisor:
    """Collaborators: `current()` (the server's broker handle now), the `data_dir` and `storage` it was
    started with, the server's `stopped` event and `stop_lock`, and `on_restarted(broker)` (the server
    takes the new handle)."""

    def __init__(self, current: Callable, data_dir: str, storage: str, stopped: threading.Event,
                 stop_lock: threading.Lock, on_restarted: Callable):
        self._current = current
        self._data_dir = data_dir
        self._storage = storage
        self._stopped = stopped
        self._stop_lock = stop_lock
        self._on_restarted = on_restarted

    def start(self) -> "BrokerSupervisor":
        threading.Thread(target=self.run, name="broker-supervisor", daemon=True).start()
        return self

    def run(self) -> None:
        while not self._stopped.wait(BROKER_CHECK_INTERVAL_S):
            b = self._current()
            if b is None or b.is_running():
                continue
            if not self._stop_lock.acquire(blocking=False):
                continue  # stopping: the broker is being stopped on purpose
            try:
                if self._stopped.is_set():
                    return
                log.warning("the embedded broker (pid %s) is gone; starting it again on port %s", b.pid, b.port)
                nb = broker_mod.start_or_reuse(self._data_dir, b.port, self._storage)
                if nb.port != b.port:
                    log.error("the embedded broker came back on port %s, not %s: restart the server", nb.port, b.port)
                self._on_restarted(nb)
            except Exception as e:
                log.error("starting the embedded broker again failed (next try in %g s): %s", BROKER_CHECK_INTERVAL_S, e)
            finally:
                self._stop_lock.release()
