"""Python's garbage collector in the server process: fewer and shorter pauses, and their record.

Why: a full (generation 2) collection walks every tracked object while it holds
the GIL, so every thread of the server stops: gRPC writes waiting for their
acknowledgement, queries, the write buffer's tail. Measured here under the ack-
latency load (bench scenario 3): after the server's start about 100,000 tracked
objects, nearly all of them imported modules, functions, classes and typing
objects that live as long as the process, and full collections of 23-50 ms
every 5-10 s, each one delaying the requests in flight by as much. Frozen at the
end of the start (`gc.freeze`: moved to a permanent generation the collector
never walks), a full collection walked ~7,000 objects and took 3-8 ms.

Invariant: only objects alive when the server finished starting are frozen, and
they are collected first (`gc.collect`), so no garbage is frozen; everything
created later is collected as usual. A reference cycle among frozen objects that
becomes garbage later is never collected: the startup objects are the
process's own modules and singletons, which live until it exits.

Who calls it: `iox serve` (server/cli/main.py), once the server serves; the pause
recorder observes into that server's metrics (`iox_gc_pause_seconds`). A
library user embedding `IoxServer` decides about its own process. Driver side
only; nothing here is pickled.
"""
from __future__ import annotations

import gc
import threading
import time

__all__ = ["freeze_startup_heap", "GcPauseRecorder"]


def freeze_startup_heap() -> int:
    """Collects, then freezes every object alive now; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauseRecorder:
    """Records the seconds of every collection, per generation, with `observe(generation, seconds)`.

    A `gc.callbacks` hook: it runs in whichever thread triggered the collection,
    while that thread holds the GIL, so it only takes two clock readings.
    `install` and `uninstall` are idempotent.
    """

    def __init__(self, observe):
        self._observe = observe
        self._started = threading.local()

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started.t = time.perf_counter()
            return
        t0 = getattr(self._started, "t", None)
        if t0 is not None:
            self._started.t = None
            self._observe(info["generation"], time.perf_counter() - t0)

    def install(self) -> "GcPauseRecorder":
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
